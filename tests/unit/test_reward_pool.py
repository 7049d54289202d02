"""The reward pool's workers find what the caller can import, and a pool broken outside a call
restarts instead of failing every later reward."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.rewards.pool import RewardPool

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pool_then_module(tmp_path: Path) -> Iterator[tuple[RewardPool, Any]]:
    """A started pool, then a module in a folder put on ``sys.path`` after its workers started (each
    worker took the caller's ``sys.path`` of its start)."""
    pool = RewardPool(workers=1, preload=())
    pool.warm()
    (tmp_path / "late_reward_mod.py").write_text("def double(x):\n    return 2 * x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield pool, importlib.import_module("late_reward_mod")
    finally:
        pool.close()
        sys.path.remove(str(tmp_path))
        sys.modules.pop("late_reward_mod", None)


def test_a_function_from_a_folder_added_after_the_workers_started_runs(
        pool_then_module: tuple[RewardPool, Any]) -> None:
    pool, module = pool_then_module
    assert pool.call(module.double, 21, timeout_s=60) == 42


def test_a_pool_broken_outside_a_call_restarts_on_the_next_call(pool_then_module: tuple[RewardPool, Any]) -> None:
    pool, module = pool_then_module
    # handed to pebble directly, by reference: the worker cannot import the module and dies while
    # taking the task (outside any call), which breaks the pool
    broken = pool._started().schedule(module.double, args=(1,))
    with pytest.raises(Exception):  # noqa: B017 (pebble's own error for a broken pool)
        broken.result(timeout=60)
    assert pool.call(module.double, 5, timeout_s=60) == 10
