"""A cache of rendered openings: the G members of a group (and rows that share a system prompt and
tool list) render and tokenise their opening conversation once.

Rendering and tokenising a ~330-token opening is about half of the driver's CPU per single-turn
episode; every member of a GRPO group renders the same one. :class:`OpeningCache` keys on the
normalised messages, tools and template variables, so a hit is exact: the cached ids are the
ids a fresh :class:`~agentrl.chat.bridge.BridgeSession` would compute.

One cache per template (the key does not name the template); bounded (least recently used entries
go first). Not thread-safe: one per event loop.

Example::

    cache = OpeningCache(template)
    session = cache.session(opening, tools=env.tool_specs())
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson

from agentrl.chat._jinja import normalize_messages, normalize_tools
from agentrl.chat.bridge import BridgeSession
from agentrl.chat.template import ChatTemplate

__all__ = ["OpeningCache"]


class OpeningCache:
    """Rendered openings of one template, ``max_entries`` at most; see the module doc."""

    def __init__(self, template: ChatTemplate, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError(f"OpeningCache.max_entries={max_entries!r}: expected an int >= 1")
        self.template = template
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[str, tuple[int, ...]]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def session(self, messages: Sequence[Any], *, tools: Sequence[Any] | None = None,
                **template_kwargs: Any) -> BridgeSession:
        """A bridge session for this opening, rendered once per distinct opening."""
        norm = normalize_messages(messages)
        norm_tools = normalize_tools(tools)
        try:
            key = orjson.dumps([norm, norm_tools, template_kwargs], option=orjson.OPT_SORT_KEYS)
        except TypeError:  # a value orjson cannot serialise: render without caching
            return BridgeSession(self.template, messages, tools=tools, **template_kwargs)
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            fresh = BridgeSession(self.template, messages, tools=tools, **template_kwargs)
            self._entries[key] = (fresh.text, tuple(fresh.prompt_ids))
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return fresh
        self.hits += 1
        self._entries.move_to_end(key)
        text, ids = entry
        return BridgeSession.from_render(self.template, norm, norm_tools, text, ids, **template_kwargs)
