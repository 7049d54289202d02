"""The agent loop's side of a context policy (:mod:`agentrl.rollout.context`): when to compact, and the
new sequence a compaction starts. Private to the rollout package; :class:`~agentrl.rollout.agent.EpisodeRunner`
holds one :class:`Compactor` when its environment has a policy.

A compaction ends the current sequence after its last model turn and starts the next one
(``fork_reason = compaction``) from the render of the conversation the policy returns, with
``info["compaction"]``: the policy, the sequence it came from, the prompt tokens before and after, the
indices of the earlier conversation's messages it kept verbatim, and what the policy did (turns dropped,
calls elided, the summary). A summary is asked in the current sequence: the environment's reply and
the instruction are bridged as its ``tool``/``user`` segments (when the reply does not leave room for
the summary, only the instruction, and the last turn and the reply are carried into the next sequence
after the summary), the summary is one sampled turn (trained unless ``train_summary`` is off, with
``info["summary_turn"]`` on that sequence), and the next sequence opens with it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.chat.bridge import BridgeOutcome, BridgePiece, BridgeResult, BridgeSession, PieceKind
from agentrl.chat.template import ChatTemplate
from agentrl.chat.types import Message
from agentrl.rollout.context import AskSummary, ContextPolicy, ContextView, Rewrite
from agentrl.trajectory import ErrorKind, ForkReason, SegmentKind, StopReason

if TYPE_CHECKING:
    from agentrl.rollout.agent import EpisodeRunner

__all__ = ["Compactor"]


@dataclass
class _Summary:
    """A summary turn under way (it survives a suspension: the next ``advance`` finishes it)."""

    view: ContextView
    ask: AskSummary
    carried: tuple[Message, ...]


class Compactor:
    """One episode's context policy with its thresholds resolved against the episode's context."""

    def __init__(self, policy: ContextPolicy, template: ChatTemplate, context: int | None,
                 template_kwargs: dict[str, Any]) -> None:
        if not isinstance(policy, ContextPolicy):
            raise TypeError(f"context_policy: expected a ContextPolicy (Window, ElideToolOutput, Summarize or "
                            f"a subclass) or None, got {type(policy).__name__}")
        self.policy, self.template, self.context, self.kwargs = policy, template, context, template_kwargs
        self.trigger, self.target = policy.thresholds(context)
        self.summary: _Summary | None = None
        # the bridge session as it was before the last turn's step (the runner keeps it): a summary steps
        # the same turn again with the instruction added, checked against the sampled text as every turn is
        self.session_before: BridgeSession | None = None

    @property
    def summarizing(self) -> bool:
        return self.summary is not None

    def due(self, next_prompt_tokens: int) -> bool:
        """The next request would pass the trigger."""
        return next_prompt_tokens > self.trigger

    def _view(self, runner: EpisodeRunner, new: Sequence[Message], tokens: int) -> ContextView:
        tools = runner.tools

        def count(messages: Sequence[Message]) -> int:
            return len(self.template.encode(messages, tools, add_generation_prompt=True, **self.kwargs))

        return ContextView(messages=(*runner.traj.messages, *new), opening=runner.opening_size, pending=len(new),
                           tokens=tokens, trigger=self.trigger, target=self.target, context=self.context,
                           count=count, count_text=lambda text: len(self.template.tokenize(text)))

    async def compact(self, runner: EpisodeRunner, new: list[Message], bridge: BridgeResult) -> StopReason | None:
        """The environment's reply ``new`` (bridged as ``bridge``) would pass the trigger: compact. Returns a
        stop reason when the episode ends here."""
        view = self._view(runner, new, runner.next_prompt_tokens(bridge))
        try:
            result = await self.policy.compact(view)
        except Exception as exc:  # a policy's bug ends the episode as a value, as an environment's does
            runner.traj.add_error(ErrorKind.CONTEXT, f"{type(self.policy).__name__}.compact raised "
                                  f"{type(exc).__name__}: {exc}", component="context")
            return StopReason.FAILED
        if result is None:
            runner.metrics["context/nothing_to_compact"] += 1
            return runner._append(bridge, new)  # as without a policy: appended if it fits the context
        if isinstance(result, AskSummary):
            return self._ask(runner, view, result, new)
        return self.start(runner, view, result)

    def start(self, runner: EpisodeRunner, view: ContextView, rewrite: Rewrite, **extra: Any) -> StopReason | None:
        """Opens the next sequence from ``rewrite`` (or ends the episode when it cannot hold a reply)."""
        traj = runner.traj
        problem = _check(rewrite)
        if problem:
            traj.add_error(ErrorKind.CONTEXT, f"{type(self.policy).__name__}: {problem}", component="context")
            return StopReason.FAILED
        messages = list(rewrite.messages)
        session = BridgeSession(self.template, messages, tools=runner.tools, **self.kwargs)
        ids = session.prompt_ids
        if self.context is not None and len(ids) >= self.context:
            traj.info["compaction_failed"] = (f"{self.policy.name}: the compacted conversation renders to {len(ids)} "
                                              f"tokens; the context holds {self.context}")
            traj.info["unsent_messages"] = [m.to_dict() for m in view.messages[len(view.messages) - view.pending:]]
            return StopReason.CONTEXT_BUDGET
        record = {"policy": self.policy.name, "from_sequence": traj.sequence_index, "tokens_before": view.tokens,
                  "tokens_after": len(ids), "trigger": self.trigger, "target": self.target,
                  "kept_messages": list(rewrite.kept), **dict(rewrite.note), **extra}
        runner.open_sequence(ids, messages, ForkReason.COMPACTION, {"compaction": record}, bridge=session)
        runner.metrics["context/compactions"] += 1
        runner.metrics[f"context/compactions/{self.policy.name}"] += 1
        note = dict(rewrite.note)
        runner.metrics["context/dropped_messages"] += int(note.get("dropped_messages", 0))
        runner.metrics["context/elided_tool_outputs"] += len(note.get("elided_messages", ()))
        return None

    # -- a summary the policy writes --------------------------------------------------------------
    def _ask(self, runner: EpisodeRunner, view: ContextView, ask: AskSummary, new: list[Message]) -> StopReason | None:
        """Bridges the reply and the instruction into the current sequence (or only the instruction, the
        rest carried over), then leaves the summary turn to :meth:`finish_summary`."""
        if ask.instruction.role != "user" or not isinstance(ask.max_tokens, int) or ask.max_tokens < 1:
            runner.traj.add_error(ErrorKind.CONTEXT, f"{type(self.policy).__name__}: AskSummary needs a user "
                                  f"instruction and max_tokens >= 1, got role={ask.instruction.role!r}, "
                                  f"max_tokens={ask.max_tokens!r}", component="context")
            return StopReason.FAILED
        traj = runner.traj
        for asked, carried in (((*new, ask.instruction), ()), ((ask.instruction,), (traj.messages[-1], *new))):
            session = copy.copy(self.session_before) if self.session_before is not None else None
            if session is not None:
                result = session.step(runner._last_ids, traj.messages[-1], list(asked))
            else:  # the stateless bridge, as the runner's own turns use it after a session ended
                result = self.template.bridge(traj.tokens, traj.messages, list(asked), tools=runner.tools,
                                              **self.kwargs)
            size = runner.next_prompt_tokens(result)
            room = ask.max_tokens if not carried else 1  # the reply's own tokens must leave the whole summary room
            if self.context is not None and size + room > self.context:
                continue
            if result.outcome is BridgeOutcome.NOT_APPEND_ONLY:  # the template rewrites history: ask in a fork
                assert result.full_render_ids is not None
                runner.metrics["bridge/fork"] += 1
                runner.open_sequence(result.full_render_ids, [*traj.messages, *asked], ForkReason.TEMPLATE,
                                     {"forked_because": result.reason})
            else:
                self._append(runner, result, list(asked))
            self.summary = _Summary(view, ask, tuple(carried))
            runner.metrics["context/summaries_asked"] += 1
            return None
        traj.info["compaction_failed"] = f"{self.policy.name}: no room left in the context for the instruction"
        traj.info["unsent_messages"] = [m.to_dict() for m in new]
        return StopReason.CONTEXT_BUDGET

    def _append(self, runner: EpisodeRunner, bridge: BridgeResult, asked: list[Message]) -> None:
        """Appends the bridged reply and instruction, each as its own segment (``tool``/``user``, then the
        instruction's ``user``) so the provenance tells them apart."""
        traj = runner.traj
        pieces = list(bridge.pieces)
        first = len(traj.messages)
        if len(asked) > 1:
            pieces = pieces[:-1] + self._split(runner, pieces[-1], asked)
        for i, piece in enumerate(pieces):
            kind = SegmentKind(piece.kind)
            index = None if kind is SegmentKind.SCAFFOLD else (first + len(asked) - 1 if i == len(pieces) - 1
                                                               else first)
            traj.append_env(piece.ids, kind=kind, message_index=index)
            runner.metrics[f"{kind.value}_tokens"] += len(piece.ids)
        traj.messages.extend(asked)
        runner.bridge_session = None  # the next sequence starts a session of its own

    def _split(self, runner: EpisodeRunner, piece: BridgePiece, asked: list[Message]) -> list[BridgePiece]:
        """The reply-and-instruction piece as two: the reply's text (its own kind) and the instruction's."""
        history = [*runner.traj.messages, *asked[:-1]]
        before = self.template.render(history, runner.tools, **self.kwargs)
        after = self.template.render([*history, asked[-1]], runner.tools, add_generation_prompt=True, **self.kwargs)
        tail = after[len(before):] if after.startswith(before) else ""
        if not tail or not piece.text.endswith(tail) or len(tail) == len(piece.text):
            return [piece]  # cannot tell them apart: one segment of kind user, as the bridge gave it
        head = piece.text[:len(piece.text) - len(tail)]
        kind: PieceKind = "tool" if all(m.role == "tool" for m in asked[:-1]) else "user"
        return [BridgePiece(tuple(self.template.tokenize(head)), kind, head),
                BridgePiece(tuple(self.template.tokenize(tail)), "user", tail)]

    async def finish_summary(self, runner: EpisodeRunner) -> StopReason | None:
        """Samples the summary turn (continuing one an abort cut short) and opens the next sequence with it."""
        assert self.summary is not None
        state = self.summary
        budget = runner.budget(state.ask.max_tokens)
        if budget <= 0 and not runner.partial_turn_tokens:
            self.summary = None
            return StopReason.MAX_SAMPLED_TOKENS if runner._bound_by_sampled else StopReason.CONTEXT_BUDGET
        if budget > 0:
            outcome = await runner.request(budget)
            if isinstance(outcome, StopReason):
                return outcome  # aborted: suspended with the summary still under way
            turn_ids = outcome[0]
        else:  # a resumed summary that had used its whole budget before the abort
            turn_ids, runner._turn_ids = tuple(runner._turn_ids), []
        self.summary = None
        traj = runner.traj
        message = self.template.parse(turn_ids, None).to_message()
        index = len(traj.messages)
        traj.messages.append(message)
        runner.metrics["context/summary_turns"] += 1
        runner.metrics["context/summary_tokens"] += len(turn_ids)
        trained = getattr(self.policy, "train_summary", True)
        if not trained:
            traj.mask_model_segments(lambda s: s.message_index == index)
        traj.info["summary_turn"] = {"message_index": index, "tokens": len(turn_ids), "trained": bool(trained)}
        text = message.content if isinstance(message.content, str) else ""
        return self.start(runner, state.view, self.policy.after_summary(state.view, text, state.carried),
                          summary_sequence=traj.sequence_index, summary_trained=bool(trained))


def _check(rewrite: Rewrite) -> str:
    """Why a policy's conversation cannot start a sequence ("" when it can)."""
    if not isinstance(rewrite, Rewrite):
        return f"compact() returned {type(rewrite).__name__}; expected a Rewrite, an AskSummary or None"
    if not rewrite.messages or not all(isinstance(m, Message) for m in rewrite.messages):
        return "the compacted conversation must be a non-empty sequence of Message objects"
    if rewrite.messages[-1].role not in ("user", "tool"):
        return (f"the compacted conversation ends with a {rewrite.messages[-1].role!r} message; expected a user or "
                "tool message for the model to answer")
    return ""
