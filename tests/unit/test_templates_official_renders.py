"""Cross-check of the shipped templates against a second, independently made set of official renders.

``tests/data/chat_templates/official_renders.json`` holds what the *official* Qwen3, Qwen3.5 and
Qwen3-Coder templates produce under ``transformers.apply_chat_template`` (transcribed
independently of ``chat_templates_official.json``; the file names each revision and the sha256 of
the exact template text used) for every issue-2 section-2 case, with and without the generation
prompt, plus random conversations that include hostile inputs (missing content, multimodal lists,
unknown roles, string arguments, odd schema keys). Each case must render to the same text, or
raise where the official template raised, with the official message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.chat import ChatTemplate

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "chat_templates" / "official_renders.json"


def _cases() -> list[dict[str, Any]]:
    return list(json.loads(FIXTURE.read_text("utf-8"))["cases"])


def test_fixture_covers_every_template_and_both_outcomes() -> None:
    cases = _cases()
    for name in ("qwen3", "qwen3_5", "qwen3_coder"):
        mine = [c for c in cases if c["template"] == name]
        assert sum("error" in c for c in mine) >= 12 and sum("expected" in c for c in mine) >= 60, name


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c['template']}:{c['id']}")
def test_matches_the_official_render(case: dict[str, Any]) -> None:
    template = ChatTemplate.from_name(case["template"])
    args = (case["messages"], case["tools"], case["add_generation_prompt"])
    if "error" in case:
        with pytest.raises(ValueError) as info:
            template.render(*args, **case["kwargs"])
        assert case["error"] in str(info.value)
    else:
        assert template.render(*args, **case["kwargs"]) == case["expected"]
