"""Constrained decoding for ``tool_choice`` ``"required"`` and a named function.

The grammar makes the turn exactly one call in the template's own JSON format, byte for byte as
the template renders a call (``<tool_call>\\n{"name": "N", "arguments": {...}}\\n</tool_call>``,
arguments in the compact ``", "``/``": "`` spacing of ``tojson``), its arguments constrained by the
tool's JSON schema. It is written in the EBNF dialect of xgrammar, SGLang's default grammar
backend (``SamplingParams.ebnf``); the turn ends where the grammar does (the agent loop's bridge
then closes the turn with a synthetic ``<|im_end|>``, never trained on). The logprobs the engine
returns are those of the constrained distribution.

Templates with XML calls (Qwen3.5, Qwen3-Coder) have no such grammar here: a forced call there is
refused with a 400 naming the template.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from agentrl.proxy._wire import RequestError

__all__ = ["forced_call_grammar"]


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@functools.lru_cache(maxsize=256)
def _grammar(tools_json: str) -> str:
    import xgrammar as xg

    tools = json.loads(tools_json)
    parts = []
    for fn in tools:
        schema = fn.get("parameters") or {"type": "object"}
        head = xg.Grammar.from_ebnf("root ::= " + _literal('<tool_call>\n{"name": ' + json.dumps(fn["name"],
                                                                                              ensure_ascii=False)
                                                           + ', "arguments": '))
        args = xg.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
        tail = xg.Grammar.from_ebnf("root ::= " + _literal("}\n</tool_call>"))
        parts.append(xg.Grammar.concat(head, args, tail))
    return str(parts[0] if len(parts) == 1 else xg.Grammar.union(*parts))


def forced_call_grammar(call_format: str, tools: list[dict[str, Any]]) -> str:
    """The EBNF forcing one call to one of ``tools`` (OpenAI function dicts); raises :class:`RequestError`
    for XML call formats, a schema the grammar compiler refuses, or no grammar compiler installed."""
    if call_format != "json":
        raise RequestError(f"tool_choice: a forced call needs a grammar for the template's {call_format!r} call "
                           "format; only JSON calls (template qwen3) have one", param="tool_choice")
    functions = [t["function"] for t in tools]
    try:
        return _grammar(json.dumps(functions, sort_keys=True))
    except ImportError:
        raise RequestError("tool_choice: a forced call needs the xgrammar package (SGLang's grammar backend) "
                           "in the proxy's environment", param="tool_choice") from None
    except (RuntimeError, ValueError, TypeError) as exc:
        raise RequestError(f"tool_choice: no grammar for these tools' parameters ({exc})", param="tools") from None
