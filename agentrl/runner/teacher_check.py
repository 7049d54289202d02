"""Refusing a teacher that would not read the student's tokens as the student does, before anything starts.

On-policy distillation scores the student's token ids with the teacher. That only means something
when both share the tokenizer (the same id is the same piece of text) and the chat template (the
teacher was trained on conversations laid out as the student renders them). This module finds the
first difference, as one line naming it:

- :func:`folder_difference`: two local Hugging Face folders (a ``model`` or ``engines`` teacher):
  the vocabulary (every token's id), the added tokens, the BPE merges, the normaliser and
  pre-tokeniser of ``tokenizer.json`` (a folder without one is read with transformers), then the
  chat template the folders declare (``chat_template`` in ``tokenizer_config.json``, or
  ``chat_template.jinja``) when both declare one;
- :func:`endpoint_difference`: a running SGLang-compatible server (an ``endpoint`` teacher): its
  ``/tokenize`` of a probe text, and of a probe conversation with a tool call rendered by its chat
  template, against the student's tokenizer and template.

Only file reads and (for an endpoint) two HTTP requests: no torch, no model weights.

Example::

    problem = folder_difference("models/student", "models/teacher")
    if problem: raise SystemExit(f"teacher.path: {problem}")
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["PROBE_TEXT", "TeacherMismatch", "endpoint_difference", "folder_difference", "probe_conversation",
           "teacher_problem"]

PROBE_TEXT = ("Compute 123 * 456 with the calculator tool, then answer in \\boxed{}.\n\n"
              "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"123 * 456\"}}\n</tool_call>"
              " Ünïcödé, 数字 789, tabs\tand  spaces.")
"""Text whose tokenisation exercises words, digits, added tokens, non-ASCII text and whitespace runs."""


def probe_conversation() -> list[dict[str, Any]]:
    """A short conversation with a tool call (system, user, the call, its result, an answer, a user turn):
    what both chat templates must render alike. It lists no tools: servers add fields of their own to a
    tool's JSON before their template renders it (SGLang 0.5.23: ``"defer_loading": null``), which would
    read as a template difference where there is none."""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 123 * 456?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "calculator", "arguments": {"expression": "123 * 456"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "56088"},
        {"role": "assistant", "content": "\\boxed{56088}"},
        {"role": "user", "content": "Thanks."},
    ]


def _show(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _tokenizer_json(folder: Path) -> dict[str, Any] | None:
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def _vocab(folder: Path, data: Mapping[str, Any] | None) -> dict[str, int]:
    """token → id, added tokens included."""
    if data is not None:
        model = data.get("model") or {}
        raw = model.get("vocab")
        vocab: dict[str, int] = {}
        if isinstance(raw, dict):
            vocab = {str(k): int(v) for k, v in raw.items()}
        elif isinstance(raw, list):  # unigram: [[piece, score], ...], the id is the position
            vocab = {str(entry[0]): i for i, entry in enumerate(raw)}
        for tok in data.get("added_tokens") or []:
            vocab[str(tok["content"])] = int(tok["id"])
        return vocab
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return {str(k): int(v) for k, v in tokenizer.get_vocab().items()}


def _vocab_difference(student: dict[str, int], teacher: dict[str, int]) -> str | None:
    if student == teacher:
        return None
    if len(student) != len(teacher):
        return f"a vocabulary of {len(teacher):,} tokens against the student's {len(student):,}"
    by_id_s = {i: t for t, i in student.items()}
    by_id_t = {i: t for t, i in teacher.items()}
    for i in sorted(set(by_id_s) | set(by_id_t)):
        if by_id_s.get(i) != by_id_t.get(i):
            return (f"token id {i} is {_show(by_id_t.get(i))} for the teacher and {_show(by_id_s.get(i))} for "
                    "the student")
    return "the same tokens under other ids"


def _tokenizer_difference(student: Path, teacher: Path) -> str | None:
    js, jt = _tokenizer_json(student), _tokenizer_json(teacher)
    vocab = _vocab_difference(_vocab(student, js), _vocab(teacher, jt))
    if vocab is not None:
        return vocab
    if js is None or jt is None:
        return None
    added_s = {str(t["content"]): bool(t.get("special")) for t in js.get("added_tokens") or []}
    added_t = {str(t["content"]): bool(t.get("special")) for t in jt.get("added_tokens") or []}
    for content in sorted(set(added_s) | set(added_t)):
        if added_s.get(content) != added_t.get(content):
            return f"the added token {_show(content)} is {'special' if added_t.get(content) else 'not special'} " \
                   f"for the teacher and {'special' if added_s.get(content) else 'not special'} for the student"
    merges_s, merges_t = (list((j.get("model") or {}).get("merges") or []) for j in (js, jt))
    if merges_s != merges_t:
        i = _first_difference(merges_s, merges_t)
        return (f"other BPE merges ({len(merges_t):,} against {len(merges_s):,}; first difference at merge {i}: "
                f"{_show(merges_t[i] if i < len(merges_t) else None)} against "
                f"{_show(merges_s[i] if i < len(merges_s) else None)})")
    for part in ("normalizer", "pre_tokenizer"):
        if js.get(part) != jt.get(part):
            return f"another {part} in tokenizer.json"
    return None


def _chat_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def folder_difference(student: str | os.PathLike[str], teacher: str | os.PathLike[str]) -> str | None:
    """``None`` when the two folders share tokenizer and chat template; else one phrase naming the first
    difference (see the module doc)."""
    s, t = Path(student), Path(teacher)
    problem = _tokenizer_difference(s, t)
    if problem is not None:
        return f"its tokenizer differs from the student's: {problem}"
    ts, tt = _chat_template(s), _chat_template(t)
    if ts is not None and tt is not None and ts != tt:
        i = _first_difference(ts, tt)
        return (f"its chat template differs from the student's at character {i}: {_show(tt[i:i + 30])} against "
                f"{_show(ts[i:i + 30])}")
    return None


def _tokenize(url: str, body: dict[str, Any], timeout_s: float) -> list[int]:
    import urllib.request

    request = urllib.request.Request(url.rstrip("/") + "/tokenize", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as the rollout's client: no proxy
    with opener.open(request, timeout=timeout_s) as resp:
        answer = json.loads(resp.read())
    return [int(i) for i in answer["tokens"]]


def endpoint_difference(url: str, template: Any, *, timeout_s: float = 10.0) -> str | None:
    """``None`` when the server at ``url`` tokenises the probe text and renders the probe conversation to
    the ids ``template`` (the student's :class:`~agentrl.chat.ChatTemplate`) gives; else one phrase
    naming the first difference, or why the server could not be asked."""
    import urllib.error

    messages = probe_conversation()
    asks = (("tokenizer", "the probe text", {"prompt": PROBE_TEXT, "add_special_tokens": False},
             list(template.tokenize(PROBE_TEXT))),
            ("chat template", "the probe conversation rendered by its chat template",
             {"messages": messages, "add_generation_prompt": True},
             list(template.encode(messages, add_generation_prompt=True))))
    for kind, what, body, mine in asks:
        try:
            theirs = _tokenize(url, body, timeout_s)
        except urllib.error.HTTPError as exc:
            return (f"POST /tokenize answered HTTP {exc.code}; expected an SGLang-compatible server that tokenises "
                    "(its ids are compared with the student's)")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"cannot ask it to tokenise ({type(exc).__name__}: {exc})"
        if theirs != mine:
            i = _first_difference(theirs, mine)
            at = f"{_show(theirs[i] if i < len(theirs) else None)} against {_show(mine[i] if i < len(mine) else None)}"
            return (f"its {kind} differs from the student's: {what} gives {len(theirs)} ids against {len(mine)}, "
                    f"first difference at position {i}: {at}")
    return None


class TeacherMismatch(ValueError):
    """A distillation teacher that does not share the student's tokenizer or chat template (one line)."""


def teacher_problem(config: RunConfig) -> str | None:
    """The one-line problem with ``config.teacher`` (a missing folder, another tokenizer or chat template,
    an endpoint that cannot be asked), or ``None``: what ``agentrl train``'s pre-flight and
    :func:`agentrl.run` check before anything starts."""
    teacher = config.teacher
    if teacher is None or teacher.kind == "self":
        return None
    if teacher.path is not None:
        from agentrl.model_folder import ModelFolderError, check_model_folder

        try:
            check_model_folder(teacher.path, what="teacher.path")
        except ModelFolderError as exc:
            return str(exc)
        why = folder_difference(config.model.tokenizer, teacher.path)
        return None if why is None else (f"teacher.path={teacher.path!r}: {why}; a teacher must share the student's "
                                         f"tokenizer and chat template ({config.model.tokenizer})")
    from transformers import AutoTokenizer

    from agentrl.chat.template import ChatTemplate

    tokenizer = AutoTokenizer.from_pretrained(config.model.tokenizer, local_files_only=True)
    template = ChatTemplate.from_name(config.model.template, tokenizer=tokenizer)
    for i, url in enumerate(teacher.urls):
        why = endpoint_difference(url, template)
        if why is not None:
            return (f"teacher.urls[{i}]={url!r}: {why}; a teacher must share the student's tokenizer and chat "
                    f"template (model.template={config.model.template!r})")
    return None
