"""Shared pieces of the proxy's unit tests: a calculator tool and scripted model turns."""

from __future__ import annotations

from typing import Any

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>'
ANSWER = "The answer is 3.<|im_end|>"


def call_then_answer(request: Any) -> str:
    """A policy (FakePolicyClient): call ``add`` until a tool result is in the prompt, then answer."""
    return ANSWER if "<tool_response>" in request.text else CALL
