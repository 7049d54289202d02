"""The proxy's unit tests share the tiny tokenizer's Qwen3 template."""

from __future__ import annotations

import pytest

from agentrl.chat import ChatTemplate
from agentrl.testing import build_tokenizer


@pytest.fixture(scope="session")
def template() -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", build_tokenizer())
