"""One real run folder for the inspect tests: 3 steps of a fake-engine run with the real trainer
(:func:`agentrl.testing.runner.build_fake_runner`), made once per session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fake_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.testing.runner import build_fake_runner, fake_run_config

    root = tmp_path_factory.mktemp("inspect-run")
    config = fake_run_config(root, steps=3, rows=8, checkpoint_every=None)
    runner, _ = build_fake_runner(config)
    asyncio.run(runner.run())
    return Path(config.run_dir())
