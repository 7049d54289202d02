"""Scripted conversations → the :class:`~agentrl.episode.Episode` the agent loop would have built.

Supervised data for a tool-using model should have RL's exact token layout: the opening rendered by
the chat template with the tools listed and the generation prompt, each assistant turn as the model
would have sampled it, each tool/user reply bridged in the template's own framing. This module
builds that layout straight from OpenAI-style messages (``{"role", "content", "tool_calls"...}``),
without an engine, a scripted client or an environment:

- the opening (every message before the first assistant turn) is one ``prompt`` segment;
- each assistant message is a ``model`` segment (loss mask 1), ending with the turn close
  (``<|im_end|>``) the model writes itself. Its text is the one the next full render shows, when
  that keeps the buffer append-only and loses none of the message (Qwen3 drops an *empty* think
  block from turns that are no longer last: such a turn is laid out without it); otherwise it is the
  turn as the last message renders (reasoning kept) and the next sequence forks, see below;
- the tool and user messages that follow it are one ``tool`` (all tool results) or ``user``
  segment (loss mask 0): the text the full render adds after the turn close, tokenised on its own;
- where the template rewrites history (a new user query strips earlier reasoning), the episode
  forks a new sequence from the full render, as :func:`~agentrl.rollout.run_episode` does.

The result is token for token what ``run_episode`` builds when a scripted client replies with each
assistant turn's text (tested: token ids, loss masks, segments), with one template render per
assistant turn and no event loop: 2-5 ms per toy-arithmetic transcript on a loaded 2-core CPU, 2-3.6x
faster than the agent loop on the same data (``bench/bench_transcripts.py``).

How SFT data is marked: model segments carry logprob ``0.0`` placeholders (nothing was sampled),
``weight_version=None`` and ``finish_reason="stop"``; each sequence has
``info["source"] = "transcript"``, ``reward`` None and status ``completed`` (``no_tool_calls`` when
the last assistant turn calls no tool, else ``env_done``). Without a reward such episodes cannot
enter :func:`~agentrl.train.build_training_batch` (an RL batch) by mistake; SFT reads only tokens
and masks. Tool or user messages after the last assistant turn are not rendered (nothing would be
trained on them); they are kept in ``info["unsent_messages"]``, as the agent loop does.

Example::

    builder = TranscriptBuilder(ChatTemplate.from_name("qwen3", tokenizer=tok))
    episode = builder.episode(row["messages"], tools=row["tools"])
    episode.trajectory.loss_mask        # 1 on assistant tokens, 0 on tool results
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.chat._jinja import normalize_messages
from agentrl.chat.conversation import check_conversation
from agentrl.chat.template import ChatTemplate
from agentrl.chat.types import Message
from agentrl.episode import Episode
from agentrl.rollout.opening import OpeningCache
from agentrl.trajectory import SegmentKind, Status, StopReason, Trajectory

__all__ = ["TranscriptBuilder", "TranscriptError", "episode_from_messages"]

SOURCE = "transcript"


class TranscriptError(ValueError):
    """A conversation that cannot be laid out as an episode (the message names the index and why)."""


class TranscriptBuilder:
    """Builds episodes from conversations with one template; reuses the rendered openings.

    ``template`` needs a tokenizer. ``template_kwargs`` (``enable_thinking``...) are passed to every
    render, as ``AgentConfig.template_kwargs`` are in the agent loop. ``vocab_size``: the model's
    vocabulary, recorded in each trajectory. Not thread-safe (the opening cache is not).
    """

    def __init__(self, template: ChatTemplate, *, template_kwargs: Mapping[str, Any] | None = None,
                 vocab_size: int | None = None, cache_size: int = 1024) -> None:
        if template.tokenizer is None:
            raise TranscriptError(f"TranscriptBuilder: template {template.name!r} has no tokenizer; build it with "
                                  "ChatTemplate.from_name(name, tokenizer=...)")
        self.template = template
        self.kwargs = dict(template_kwargs or {})
        self.vocab_size = vocab_size
        self.close = template.turn_close
        self._openings = OpeningCache(template, max_entries=cache_size)

    def episode(self, messages: Sequence[Any], *, tools: Sequence[Any] | None = None,
                group_id: str | None = None, rollout_id: str | None = None,
                sample_id: str | None = None) -> Episode:
        """The episode of one conversation (``Message`` objects or OpenAI-style dicts).

        Raises :class:`TranscriptError` when the conversation has no assistant turn, two assistant
        turns in a row, a tool message that answers nothing, or a render the template refuses.
        """
        try:
            checked, tool_list = check_conversation(messages, tools)
        except ValueError as exc:
            raise TranscriptError(str(exc)) from None
        first = next((i for i, m in enumerate(checked) if m.role == "assistant"), None)
        if first is None:
            raise TranscriptError("messages: no assistant message; expected at least one assistant turn to train on")
        if first == 0:
            raise TranscriptError("messages[0]: an assistant turn opens the conversation; expected a system or user "
                                  "message before it")
        turns = _turns(checked, first)
        try:
            return self._lay_out(checked, first, turns, tool_list, group_id, rollout_id or os.urandom(16).hex(),
                                 sample_id)
        except ValueError as exc:  # ChatTemplateError included
            if isinstance(exc, TranscriptError):
                raise
            raise TranscriptError(f"messages: {exc}") from None

    def _lay_out(self, checked: list[Message], first: int, turns: list[tuple[int, int]],
                 tools: list[dict[str, Any]] | None, group_id: str | None, rollout_id: str,
                 sample_id: str | None) -> Episode:
        tpl, kwargs = self.template, self.kwargs
        norm = normalize_messages(checked)  # once: the renders below take plain dicts
        session = self._openings.session(norm[:first], tools=tools, **kwargs)
        text, norm_tools = session.text, session.tools
        history = list(session.messages)
        ids = {"group_id": group_id, "rollout_id": rollout_id, "sample_id": sample_id}
        traj = Trajectory.from_prompt(session.prompt_ids, messages=checked[:first], vocab_size=self.vocab_size, **ids)
        sequences = [traj]
        for turn_no, (index, end) in enumerate(turns):
            added = norm[index + 1:end]
            last = turn_no == len(turns) - 1
            reply = norm[index]
            full = None if last else tpl.render_normalized([*history, reply, *added], norm_tools, True, **kwargs)
            model_text = self._model_text(full, text, history, reply, norm_tools, index)
            model_ids = tpl.tokenize(model_text)
            traj.append_model(model_ids, [0.0] * len(model_ids), finish_reason="stop", message_index=len(traj.messages))
            traj.messages.append(checked[index])
            history.append(reply)
            if last:
                break
            assert full is not None
            env_messages = checked[index + 1:end]
            if full.startswith(text + model_text):
                kind = SegmentKind.TOOL if all(m.role == "tool" for m in env_messages) else SegmentKind.USER
                traj.append_env(tpl.tokenize(full[len(text) + len(model_text):]), kind=kind,
                                message_index=len(traj.messages))
                traj.messages.extend(env_messages)
            else:
                traj = Trajectory.from_prompt(tpl.tokenize(full), messages=[*traj.messages, *env_messages],
                                              vocab_size=self.vocab_size, **ids)
                traj.sequence_index = len(sequences)
                traj.info["forked_because"] = "the template rewrites the history (not append-only)"
                sequences.append(traj)
            history.extend(added)
            text = full
        return _finish(sequences, checked, turns)

    def _model_text(self, full: str | None, text: str, history: list[dict[str, Any]], reply: dict[str, Any],
                    tools: list[dict[str, Any]] | None, index: int) -> str:
        """The turn's text: as the next full render shows it when that keeps the buffer append-only and
        loses none of the message (its reasoning), else as the render that ends with the turn."""
        if full is not None and full.startswith(text):
            cut = full.find(self.close, len(text))
            if cut >= 0:
                shown = full[len(text): cut + len(self.close)]
                reasoning = reply.get("reasoning_content")
                if not isinstance(reasoning, str) or reasoning.strip() in shown:
                    return shown
        return self._alone(history, reply, tools, text, index)

    def _alone(self, history: list[dict[str, Any]], reply: dict[str, Any], tools: list[dict[str, Any]] | None,
               text: str, index: int) -> str:
        rendered = self.template.render_normalized([*history, reply], tools, False, **self.kwargs)
        if not rendered.startswith(text):
            raise TranscriptError(f"messages[{index}]: the template renders the conversation before this assistant "
                                  "turn differently once the turn is added; it cannot be laid out token by token")
        cut = rendered.find(self.close, len(text))
        if cut < 0:
            raise TranscriptError(f"messages[{index}]: the render has no {self.close!r} after this assistant turn; "
                                  "the template does not close turns with it")
        return rendered[len(text): cut + len(self.close)]


def _turns(messages: list[Message], first: int) -> list[tuple[int, int]]:
    """``(assistant index, end of its environment reply)`` per assistant turn."""
    turns: list[tuple[int, int]] = []
    i = first
    while i < len(messages):
        j = i + 1
        while j < len(messages) and messages[j].role != "assistant":
            if messages[j].role == "system":
                raise TranscriptError(f"messages[{j}]: a system message after the opening; expected tool or user "
                                      "messages between assistant turns")
            j += 1
        if j == i + 1 and j < len(messages):
            raise TranscriptError(f"messages[{j}]: two assistant turns in a row ({i} and {j}); expected a tool or "
                                  "user message between them (merge them into one turn)")
        turns.append((i, j))
        i = j
    return turns


def _finish(sequences: list[Trajectory], messages: list[Message], turns: list[tuple[int, int]]) -> Episode:
    last_index, end = turns[-1]
    calls = bool(messages[last_index].tool_calls)
    reason = StopReason.ENV_DONE if calls else StopReason.NO_TOOL_CALLS
    for seq in sequences:
        seq.info["source"] = SOURCE
        seq.finish(Status.COMPLETED, reason)
    if end > last_index + 1:
        sequences[-1].info["unsent_messages"] = [m.to_dict() for m in messages[last_index + 1:end]]
    return Episode(sequences=sequences)


def episode_from_messages(messages: Sequence[Any], template: ChatTemplate, *, tools: Sequence[Any] | None = None,
                          template_kwargs: Mapping[str, Any] | None = None, vocab_size: int | None = None,
                          group_id: str | None = None, rollout_id: str | None = None) -> Episode:
    """One conversation's episode (see the module doc); for many, keep one :class:`TranscriptBuilder`."""
    builder = TranscriptBuilder(template, template_kwargs=template_kwargs, vocab_size=vocab_size, cache_size=1)
    return builder.episode(messages, tools=tools, group_id=group_id, rollout_id=rollout_id)
