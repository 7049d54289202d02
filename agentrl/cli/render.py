"""``agentrl render``: show how a chat template turns a conversation into text (and tokens).

    agentrl render examples/conversation.json --template qwen3 [--tokens] [--generation-prompt]

The file holds either ``{"messages": [...], "tools": [...]}`` (``tools`` and ``template_kwargs``
optional) or a bare list of OpenAI-style messages, checked by
:func:`agentrl.chat.check_conversation` (the same check, and the same messages, as the Python API).
``--tokens`` also prints each token id with its text, using the tokenizer from ``--tokenizer`` (a
local Hugging Face tokenizer folder) or, by default, agentrl's small test tokenizer (the Qwen
special tokens with a 2k byte-level BPE vocabulary, so ids differ from a real Qwen model's); the
table says which one it used.

Every problem with the input (file, conversation, template, tokenizer folder) is one line
``error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentrl.chat import TEMPLATE_NAMES, ChatTemplate, ChatTemplateError, check_conversation
from agentrl.cli._errors import fail

__all__ = ["ConversationFileError", "load_conversation", "render"]


class ConversationFileError(ValueError):
    """The conversation file cannot be read or is not a conversation."""

_MARKUP = re.compile(r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>|</?tool_call>|</?tool_response>|</?think>")


def load_conversation(path: Path) -> tuple[list[Any], list[Any] | None, dict[str, Any]]:
    """Reads ``(messages, tools, template_kwargs)`` from a JSON file; raises :class:`ConversationFileError`
    naming the file and the field at fault (the shape only: :func:`check_conversation` checks the content)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversationFileError(f"{path}: cannot read a JSON conversation ({exc})") from exc
    if isinstance(data, list):
        return data, None, {}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise ConversationFileError(
            f"{path}: expected a list of messages or an object with a 'messages' list, got "
            f"{type(data).__name__} with keys {sorted(data) if isinstance(data, dict) else '-'}")
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ConversationFileError(f"{path}: 'tools': expected a list of tool schemas, got {type(tools).__name__}")
    kwargs = data.get("template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ConversationFileError(f"{path}: 'template_kwargs': expected an object, got {type(kwargs).__name__}")
    return data["messages"], tools, kwargs


def _styled(text: str) -> Text:
    out = Text()
    pos = 0
    for match in _MARKUP.finditer(text):
        out.append(text[pos:match.start()])
        out.append(match.group(), style="bold magenta" if match.group().startswith("<|") else "bold cyan")
        pos = match.end()
    out.append(text[pos:])
    return out


def _token_table(template: ChatTemplate, ids: list[int]) -> Table:
    table = Table(title=f"{len(ids)} tokens", show_lines=False)
    table.add_column("pos", justify="right", style="dim")
    table.add_column("id", justify="right")
    table.add_column("text")
    for pos, token_id in enumerate(ids):
        table.add_row(str(pos), str(token_id), repr(template.decode([token_id])))
    return table


TEST_TOKENIZER_NAME = "agentrl test tokenizer (ids differ from a real Qwen model's; pass --tokenizer)"


def _tokenizer(path: Path | None) -> tuple[Any, str]:
    """The tokenizer and how to name it in the output."""
    if path is None:
        from agentrl.testing import build_tokenizer

        return build_tokenizer(), TEST_TOKENIZER_NAME
    from transformers import AutoTokenizer

    from agentrl.model_folder import ModelFolderError, check_model_folder

    try:
        folder = check_model_folder(path, needs=("tokenizer",), what="--tokenizer")
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True), str(path)
    except (ModelFolderError, OSError, ValueError) as exc:
        fail(str(exc).splitlines()[0])


def render(
    conversation: Annotated[Path, typer.Argument(
        help="JSON file: {'messages': [...], 'tools': [...]} or a list of messages.")],
    template: Annotated[str, typer.Option("--template", "-t", help=f"One of {', '.join(TEMPLATE_NAMES)}.")] = "qwen3",
    tokens: Annotated[bool, typer.Option("--tokens", help="Also print the token ids and their text.")] = False,
    generation_prompt: Annotated[bool, typer.Option(
        "--generation-prompt/--no-generation-prompt", help="Append the assistant generation prompt.")] = False,
    thinking: Annotated[bool | None, typer.Option(
        "--thinking/--no-thinking", help="Pass enable_thinking to the template (Qwen3, Qwen3.5).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", help="Local Hugging Face tokenizer folder for --tokens.")] = None,
) -> None:
    """Render a conversation with a chat template, exactly as Hugging Face apply_chat_template would.

    \b
    Examples:
      agentrl render examples/conversation.json
      agentrl render examples/conversation.json --template qwen3_5 --no-thinking
      agentrl render examples/conversation.json --generation-prompt
      agentrl render examples/conversation.json --tokens --tokenizer models/tiny
    """
    if template not in TEMPLATE_NAMES:
        fail(f"--template: unknown template {template!r}; expected one of {', '.join(TEMPLATE_NAMES)}")
    try:
        raw_messages, raw_tools, kwargs = load_conversation(conversation)
        messages, tools = check_conversation(raw_messages, raw_tools)
    except ValueError as exc:  # ConversationFileError included
        fail(str(exc) if isinstance(exc, ConversationFileError) else f"{conversation}: {exc}")
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    console = Console()
    tok, tokenizer_name = _tokenizer(tokenizer) if tokens else (None, "")
    tpl = ChatTemplate.from_name(template, tokenizer=tok)
    try:
        text = tpl.render(messages, tools, add_generation_prompt=generation_prompt, **kwargs)
    except (ChatTemplateError, TypeError, ValueError) as exc:
        fail(f"{conversation}: {exc}")
    title = f"{conversation.name} · {template} · tool calls: {tpl.tool_call_format} · {len(text)} characters"
    console.rule(title, align="left")
    # Soft wrap: the terminal may fold long lines, but no line break is added to the rendered text.
    console.print(_styled(text), soft_wrap=True, highlight=False, end="")
    console.rule()
    if tokens:
        console.print(f"tokenizer: {tokenizer_name}", soft_wrap=True, highlight=False)
        console.print(_token_table(tpl, tpl.tokenize(text)))
