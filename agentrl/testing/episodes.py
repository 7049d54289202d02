"""Episodes to look at: a showcase run through the real agent loop, and large synthetic ones.

- :func:`showcase_episode`: the agent loop (qwen3 template, the test tokenizer, a scripted client)
  against an environment with a lookup tool whose output is hostile HTML
  (:data:`HOSTILE_TOOL_OUTPUT`) and the real calculator. The script thinks, calls the lookup,
  sends a malformed call (a ``malformed_json`` failure fed back), calculates under a newer weight
  version, gets a user turn (which makes the template drop the earlier reasoning, so the episode
  forks into a second sequence), and answers. The turns of the older weight version are masked
  (off-policy), and the model tokens get varied logprobs so the heat map has something to show.
- :func:`synthetic_episode`: a trajectory of about ``n_tokens`` tokens built with the real
  :class:`~agentrl.Trajectory` mutators, for benchmarks of large runs.

Use in tests, benchmarks and docs only.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, ClassVar

from agentrl.chat.template import ChatTemplate
from agentrl.chat.types import Message
from agentrl.environments.base import Environment, StepResult
from agentrl.episode import Episode
from agentrl.rewards.types import Reward
from agentrl.tools import Tool, calculator, tool
from agentrl.trajectory import SegmentKind, Status, StopReason, Trajectory

__all__ = ["HOSTILE_TOOL_OUTPUT", "showcase_episode", "synthetic_episode"]

HOSTILE_TOOL_OUTPUT = '</script><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> & <b>bold</b>'


@tool
async def lookup(query: str) -> str:
    """Looks a term up in a (deliberately hostile) glossary.

    Args:
        query: the term to look up.
    """
    return f"{query}: {HOSTILE_TOOL_OUTPUT}"


class _ShowcaseEnv(Environment):
    tools: ClassVar[tuple[Tool, ...]] = (lookup, calculator)

    async def reset(self) -> list[Message]:
        return [Message("system", "Use the tools, then answer as \\boxed{N}."),
                Message("user", "What is 6 * 7? Look up 'product' first.")]

    async def step(self, reply: Message, failures: Any = ()) -> StepResult:
        result = await super().step(reply, failures)
        if self.turns == 3 and not result.done:
            result.messages.append(Message("user", "Please double-check, then answer."))
        return result

    def reward(self, trajectory: Trajectory) -> Reward:
        text = trajectory.messages[-1].content if trajectory.messages else ""
        correct = 1.0 if isinstance(text, str) and "\\boxed{42}" in text else 0.0
        return Reward(correct, parts={"correct": correct})


_SCRIPT = (
    ("<think>\nI should look the word up first.\n</think>\n\n<tool_call>\n"
     '{"name": "lookup", "arguments": {"query": "product"}}\n</tool_call><|im_end|>', "3"),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 *</tool_call><|im_end|>', "3"),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call><|im_end|>', "4"),
    ("<think>\nThe calculator said 42.\n</think>\n\nThe answer is \\boxed{42}.<|im_end|>", "4"),
)


def showcase_episode(tokenizer: Any = None) -> Episode:
    """The showcase episode (see the module doc); ``tokenizer`` defaults to the test tokenizer."""
    from agentrl.rollout.agent import AgentConfig, run_episode
    from agentrl.rollout.types import SamplingParams
    from agentrl.testing.scripted import ScriptedClient, ScriptedTurn
    from agentrl.testing.tokenizer import build_tokenizer

    tok = tokenizer if tokenizer is not None else build_tokenizer()
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    client = ScriptedClient(tok, [ScriptedTurn(text, weight_version=v) for text, v in _SCRIPT])
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=256))
    episode = asyncio.run(run_episode(_ShowcaseEnv({}), template, client, config))
    for seq in episode.sequences:
        rng = random.Random(seq.sequence_index)
        for seg in seq.segments_of(SegmentKind.MODEL):
            for pos in range(seg.start - seq.prompt_length, seg.end - seq.prompt_length):
                seq.logprobs[pos] = -min(12.0, rng.expovariate(1.5))
        seq.mask_model_segments(lambda s: s.weight_version == "3")
        seq.validate()
    return episode


def synthetic_episode(n_tokens: int, *, seed: int = 0, vocab_size: int = 2048, turns: int = 4,
                      group_id: str | None = None, index: int = 0) -> Episode:
    """One finished episode of about ``n_tokens`` tokens: a prompt, then ``turns`` model turns with
    tool results between them, built with the real mutators (ids random under ``vocab_size``)."""
    rng = random.Random(seed)
    prompt = max(1, n_tokens // 8)
    per_turn = max(2, (n_tokens - prompt) // (2 * turns))
    traj = Trajectory.from_prompt([rng.randrange(vocab_size) for _ in range(prompt)], vocab_size=vocab_size,
                                  group_id=group_id or f"g{seed // 8}", rollout_id=f"r{seed}", sample_id=f"{seed}:{index}")
    messages = [Message("system", "synthetic"), Message("user", f"question {seed}")]
    for turn in range(turns):
        ids = [rng.randrange(vocab_size) for _ in range(per_turn)]
        lps = [-min(20.0, rng.expovariate(2.0)) for _ in ids]
        traj.append_model(ids, lps, weight_version=str(turn // 2), finish_reason="stop", message_index=len(messages))
        messages.append(Message("assistant", f"turn {turn}"))
        if turn < turns - 1:
            traj.append_env([rng.randrange(vocab_size) for _ in range(per_turn)], kind=SegmentKind.TOOL,
                            message_index=len(messages))
            messages.append(Message("tool", f"result {turn}", name="calculator"))
    traj.messages = messages
    traj.reward = float(rng.random() < 0.5)
    traj.reward_parts = {"correct": traj.reward}
    traj.metrics = {"tool_calls": float(turns - 1), "turns": float(turns)}
    if rng.random() < 0.2:
        traj.metrics["failures/malformed_json"] = 1.0
    outcome = rng.random()
    if outcome < 0.7:
        traj.finish(Status.COMPLETED, StopReason.NO_TOOL_CALLS)
    elif outcome < 0.85:
        traj.finish(Status.COMPLETED, StopReason.MAX_TURNS)
    else:
        traj.finish(Status.TRUNCATED, StopReason.ENGINE_LENGTH)
    return Episode(sequences=[traj], env_info=[{"turn": t + 1, "tool_calls": 1} for t in range(turns - 1)])
