"""``agentrl render``: the README's demo command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.chat import ChatTemplate
from agentrl.cli import app
from agentrl.cli.render import load_conversation
from agentrl.testing import build_tokenizer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation.json"
runner = CliRunner()


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5", "qwen3_coder"])
def test_render_prints_the_exact_template_text(name: str) -> None:
    result = runner.invoke(app, ["render", str(EXAMPLE), "--template", name], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    messages, tools, _ = load_conversation(EXAMPLE)
    assert ChatTemplate.from_name(name).render(messages, tools) in result.output


def test_render_tokens_and_generation_prompt() -> None:
    result = runner.invoke(app, ["render", str(EXAMPLE), "-t", "qwen3", "--tokens", "--generation-prompt",
                                 "--no-thinking"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    messages, tools, _ = load_conversation(EXAMPLE)
    tpl = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
    ids = tpl.encode(messages, tools, add_generation_prompt=True, enable_thinking=False)
    assert f"{len(ids)} tokens" in result.output
    assert re.search(rf"│\s+{tpl.turn_close_id}\s+│\s+'<\|im_end\|>'", result.output)


def test_render_reports_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"msgs": []}))
    result = runner.invoke(app, ["render", str(bad)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "'messages' list" in result.output
    result = runner.invoke(app, ["render", str(EXAMPLE), "--template", "llama"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "qwen3_coder" in result.output
    rejected = tmp_path / "no_query.json"
    rejected.write_text(json.dumps([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]))
    result = runner.invoke(app, ["render", str(rejected), "--template", "qwen3_5"], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "No user query found" in result.output
