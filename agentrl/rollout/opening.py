"""A cache of rendered openings: the G members of a group (and rows that share a system prompt and
tool list) render and tokenise their opening conversation once.

Rendering and tokenising a ~330-token opening is about half of the driver's CPU per single-turn
episode; every member of a GRPO group renders the same one. :class:`OpeningCache` keys on the
normalised messages, tools and template variables, so a hit is exact: the cached ids are the
ids a fresh :class:`~agentrl.chat.bridge.BridgeSession` would compute.

On a miss, the part of the opening before its last user turn (the system prompt and tool list,
shared by every row of a dataset) is tokenised once and reused; only the question is tokenised per
row. One cache per template (the key does not name the template); bounded (least recently used
entries go first). Not thread-safe: one per event loop.

Example::

    cache = OpeningCache(template)
    session = cache.session(opening, tools=env.tool_specs())
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from agentrl.chat._jinja import normalize_messages, normalize_tools
from agentrl.chat.bridge import BridgeSession
from agentrl.chat.template import ChatTemplate
from agentrl.trajectory import CheckedIds

__all__ = ["OpeningCache"]


@dataclass(frozen=True)
class _Opening:
    """A rendered opening; its normalised messages and tools are shared by every session made from it
    (sessions never mutate them: each step builds new lists)."""

    text: str
    ids: CheckedIds  # checked once here, trusted by every member's Trajectory.from_prompt
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


class OpeningCache:
    """Rendered openings of one template, ``max_entries`` at most; see the module doc."""

    TURN_OPEN = "<|im_start|>"

    def __init__(self, template: ChatTemplate, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError(f"OpeningCache.max_entries={max_entries!r}: expected an int >= 1")
        self.template = template
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, _Opening] = OrderedDict()
        self._prefixes: OrderedDict[str, tuple[int, ...] | None] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def session(self, messages: Sequence[Any], *, tools: Sequence[Any] | None = None,
                **template_kwargs: Any) -> BridgeSession:
        """A bridge session for this opening, rendered once per distinct opening."""
        try:  # messages are dataclasses and tools plain dicts: orjson keys them without normalising
            key = orjson.dumps([messages, tools, template_kwargs], option=orjson.OPT_SORT_KEYS)
        except TypeError:  # a value orjson cannot serialise: render without caching
            return BridgeSession(self.template, messages, tools=tools, **template_kwargs)
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            norm = normalize_messages(messages)
            norm_tools = normalize_tools(tools)
            text = self.template.render_normalized(norm, norm_tools, add_generation_prompt=True, **template_kwargs)
            entry = self._entries[key] = _Opening(text, CheckedIds(self._tokenize(text)), norm, norm_tools)
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        else:
            self.hits += 1
            self._entries.move_to_end(key)
        return BridgeSession.from_render(self.template, entry.messages, entry.tools, entry.text, entry.ids,
                                         **template_kwargs)

    def _tokenize(self, text: str) -> list[int]:
        """Tokenises ``text``, reusing the ids of everything before its last user turn when an earlier
        opening had the same prefix (system prompt and tool list): rows differ only in the question.

        The split falls on a turn-open special token, which tokenisers never merge across; each new
        prefix is still checked once against a whole-text tokenisation before it is reused."""
        last = text.rfind(self.TURN_OPEN)
        cut = text.rfind(self.TURN_OPEN, 0, last) if last > 0 else -1
        if cut <= 0:
            return self.template.tokenize(text)
        prefix = text[:cut]
        if prefix in self._prefixes:
            self._prefixes.move_to_end(prefix)
            prefix_ids = self._prefixes[prefix]
            if prefix_ids is not None:
                return [*prefix_ids, *self.template.tokenize(text[cut:])]
            return self.template.tokenize(text)
        whole = self.template.tokenize(text)
        prefix_ids = tuple(self.template.tokenize(prefix))
        exact = tuple(whole[: len(prefix_ids)]) == prefix_ids and \
            whole[len(prefix_ids):] == self.template.tokenize(text[cut:])
        self._prefixes[prefix] = prefix_ids if exact else None
        if len(self._prefixes) > 256:
            self._prefixes.popitem(last=False)
        return whole
