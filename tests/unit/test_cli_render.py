"""``agentrl render``: the README's demo command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.chat import ChatTemplate, check_conversation
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
    assert result.exit_code == 2 and "No user query found" in result.output
    result = runner.invoke(app, ["render", str(tmp_path / "missing.json")], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and result.output.startswith("error: ") and "missing.json" in result.output


CALL = {"type": "function", "function": {"name": "calc", "arguments": {"code": "1"}}}
TOOL = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(("conversation", "tools"), [
    ([{"role": "bot", "content": "hi"}], None),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "content": "", "tool_calls": [{**CALL, "function": {"name": "calc", "arguments": "{no"}}]}],
     None),
    ([{"role": "user", "content": "q"}], [{"name": "calc", "parameters": {"type": "object"}}]),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "2"}], [TOOL]),
], ids=["unknown-role", "non-json-arguments", "tool-without-function-wrapper", "tool-message-without-a-turn"])
def test_render_refuses_what_the_python_api_refuses_with_its_message(tmp_path: Path, conversation: list[object],
                                                                    tools: list[object] | None) -> None:
    with pytest.raises(ValueError) as info:
        check_conversation(conversation, tools)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"messages": conversation, "tools": tools}))
    result = runner.invoke(app, ["render", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert result.output == f"error: {path}: {info.value}\n"


def test_a_tool_message_after_an_assistant_turn_is_fine() -> None:
    ok = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
          {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    messages, tools = check_conversation(ok, [TOOL])
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool"] and tools == [TOOL]
    # a call that failed to parse leaves no tool_calls, and the environment still answers with a tool message
    failed = [ok[0], {"role": "assistant", "content": "<tool_call>\n{bad\n</tool_call>"}, ok[2]]
    assert len(check_conversation(failed)[0]) == 3


def test_render_tokens_names_its_tokenizer(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", str(EXAMPLE), "--tokens"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "tokenizer: agentrl test tokenizer" in result.output
    folder = tmp_path / "tok"
    build_tokenizer().save_pretrained(str(folder))
    result = runner.invoke(app, ["render", str(EXAMPLE), "--tokens", "--tokenizer", str(folder)],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 0 and f"tokenizer: {folder}" in result.output
    result = runner.invoke(app, ["render", str(EXAMPLE), "--tokens", "--tokenizer", str(tmp_path / "nope")])
    assert result.exit_code == 2 and result.output.startswith("error: --tokenizer: ") and "does not exist" in result.output


def test_version_and_help_that_fits_80_columns() -> None:
    from agentrl import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"agentrl {__version__}\n"
    for command in ([], ["render"], ["doctor"], ["env"], ["env", "check"], ["inspect"], ["sft"], ["train"], ["eval"]):
        result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
        assert result.exit_code == 0, result.output
        for line in result.output.splitlines():
            cut = "…" in line or (line.rstrip().endswith("...") and not line.startswith("Usage:"))
            assert len(line) <= 80 and not cut, (command, line)
