"""Shared pytest fixtures for agentrl's tests."""

from typing import Any

import pytest

from agentrl.testing import build_tokenizer


@pytest.fixture(scope="session")
def tok() -> Any:
    """The local test tokenizer (built once, cached on disk), shared by every test that needs one."""
    return build_tokenizer()
