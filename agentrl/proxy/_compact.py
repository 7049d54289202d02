"""A proxy session's context policy (:mod:`agentrl.rollout.context`): compaction for a harness that does
not compact its own history.

A harness that handles ``context_length_exceeded`` compacts by itself: its next, shorter request forks
a sequence (``fork_reason = compaction``) and trains. A session given a policy compacts on the harness's
behalf instead: when a request's prompt would pass the policy's trigger, the session starts a sequence
from the policy's conversation (:class:`~agentrl.rollout.context.Rewrite`: ``window``,
``elide_tool_output``, ``summarize`` with a separate ``summarizer``, or your own) and remembers the
harness's messages it stands for, so the harness's later requests (which still carry its whole
history) continue that sequence until the next compaction. A policy that asks the model itself for a
summary (:class:`~agentrl.rollout.context.AskSummary`) needs a turn the harness never asked for: the
session refuses it when built. Private to the proxy package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.chat.template import ChatTemplate
from agentrl.chat.types import Message
from agentrl.rollout.context import ContextPolicy, ContextView, Rewrite, Summarize

__all__ = ["ProxyCompactor"]


class ProxyCompactor:
    """One session's policy with its thresholds resolved against the session's context."""

    def __init__(self, policy: ContextPolicy, template: ChatTemplate, context: int | None,
                 template_kwargs: dict[str, Any]) -> None:
        if not isinstance(policy, ContextPolicy):
            raise TypeError(f"context_policy: expected a ContextPolicy or None, got {type(policy).__name__}")
        if isinstance(policy, Summarize) and policy.summarizer is None:
            raise ValueError("context_policy: Summarize without a summarizer asks the model for a summary in a turn "
                             "the harness never asked for, which a proxy session cannot serve; give it a summarizer "
                             "(its text becomes the next sequence's prompt), use window or elide_tool_output, or let "
                             "the harness compact on context_length_exceeded")
        self.policy, self.template, self.context, self.kwargs = policy, template, context, template_kwargs
        self.trigger, self.target = policy.thresholds(context)

    def due(self, size: int) -> bool:
        return size > self.trigger

    def count(self, messages: Sequence[Message], tools: Sequence[Any] | None) -> int:
        return len(self.template.encode(messages, tools, add_generation_prompt=True, **self.kwargs))

    async def compact(self, conversation: list[Message], tools: Sequence[Any] | None, size: int) -> Rewrite | None:
        """The policy's conversation for ``conversation`` (None: nothing to compact, or a summary the
        session cannot ask for). Raises ``ValueError`` naming what went wrong when the policy fails."""
        opening = next((i for i, m in enumerate(conversation) if m.role == "assistant"), len(conversation))
        last = max((i for i, m in enumerate(conversation) if m.role == "assistant"), default=-1)
        view = ContextView(messages=tuple(conversation), opening=opening, pending=len(conversation) - last - 1,
                           tokens=size, trigger=self.trigger, target=self.target, context=self.context,
                           count=lambda m: self.count(m, tools),
                           count_text=lambda text: len(self.template.tokenize(text)))
        try:
            result = await self.policy.compact(view)
        except Exception as exc:
            raise ValueError(f"{type(self.policy).__name__}.compact raised {type(exc).__name__}: {exc}") from exc
        if result is None or not isinstance(result, Rewrite):
            return None
        if not result.messages or result.messages[-1].role not in ("user", "tool"):
            raise ValueError(f"{type(self.policy).__name__}: the compacted conversation must end with a user or tool "
                             "message for the model to answer")
        return result

    def record(self, rewrite: Rewrite, before: int, after: int, previous: int | None) -> dict[str, Any]:
        """The new sequence's ``info["compaction"]``, as the agent loop writes it."""
        return {"policy": self.policy.name, "from_sequence": previous, "tokens_before": before, "tokens_after": after,
                "trigger": self.trigger, "target": self.target, "kept_messages": list(rewrite.kept),
                **dict(rewrite.note)}
