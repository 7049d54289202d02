"""Scripted conversations laid out as episodes: token for token what the agent loop builds when a scripted
client replies with each assistant turn (ids, masks, segments), across the shipped templates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from agentrl.chat import TEMPLATE_NAMES, ChatTemplate, Message, ToolCallFailure
from agentrl.environments import Environment, StepResult
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.types import SamplingParams
from agentrl.sft import TranscriptBuilder, TranscriptError, episode_from_messages
from agentrl.testing import build_tokenizer
from agentrl.testing.scripted import ScriptedClient, ScriptedTurn
from agentrl.tools import calculator, tool_schema
from agentrl.train import build_training_batch
from agentrl.trajectory import SegmentKind, Status, StopReason, Trajectory

CALC = tool_schema(calculator)
SEARCH = {"type": "function", "function": {"name": "search", "description": "Look something up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                          "required": ["q"]}}}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


ARITHMETIC = [
    {"role": "system", "content": "Use the calculator, then give the answer as \\boxed{N}."},
    {"role": "user", "content": "What is 487 * 925?"},
    {"role": "assistant", "content": "", "tool_calls": [call("calculator", expression="487 * 925")]},
    {"role": "tool", "content": "450475", "name": "calculator"},
    {"role": "assistant", "content": "\\boxed{450475}"},
]
TWO_CALLS = [
    {"role": "user", "content": "What is 2**10 and who wrote Hamlet?"},
    {"role": "assistant", "content": "Two things to find.", "reasoning_content": "I should call both tools.",
     "tool_calls": [call("calculator", expression="2**10"), call("search", q="Hamlet author")]},
    {"role": "tool", "content": "1024", "name": "calculator"},
    {"role": "tool", "content": "William Shakespeare", "name": "search"},
    {"role": "assistant", "content": "", "tool_calls": [call("calculator", expression="1024 + 1")]},
    {"role": "tool", "content": "1025", "name": "calculator"},
    {"role": "assistant", "content": "1024; Shakespeare.", "reasoning_content": "Both found."},
]
FOLLOW_UP = [  # a new user query: Qwen3 templates strip earlier reasoning, so the episode forks there
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2**10?"},
    {"role": "assistant", "content": "1024", "reasoning_content": "Powers of two."},
    {"role": "user", "content": "And 2**11?"},
    {"role": "assistant", "content": "", "tool_calls": [call("calculator", expression="2**11")]},
    {"role": "tool", "content": "2048", "name": "calculator"},
    {"role": "assistant", "content": "2048"},
]
CONVERSATIONS = {"arithmetic": (ARITHMETIC, [CALC]), "two_calls": (TWO_CALLS, [CALC, SEARCH]),
                 "follow_up": (FOLLOW_UP, [CALC])}


class ReplayEnv(Environment):
    """Replays a conversation's opening and its tool/user replies; the agent loop drives the turns."""

    def __init__(self, conversation: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        super().__init__({})
        self.messages = [Message.from_dict(m) for m in conversation]
        self.specs = tools
        first = next(i for i, m in enumerate(self.messages) if m.role == "assistant")
        self.opening = self.messages[:first]
        self.replies: list[list[Message]] = []
        for i, m in enumerate(self.messages):
            if m.role == "assistant":
                j = i + 1
                while j < len(self.messages) and self.messages[j].role != "assistant":
                    j += 1
                self.replies.append(self.messages[i + 1:j])

    def tool_specs(self) -> list[dict[str, Any]]:
        return self.specs

    async def reset(self) -> list[Message]:
        return list(self.opening)

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        self._begin_step()
        new = self.replies[self.turns - 1]
        if self.turns == len(self.replies):
            return self._finish(StepResult(), StopReason.ENV_DONE if reply.tool_calls else StopReason.NO_TOOL_CALLS)
        return StepResult(messages=list(new))

    def reward(self, trajectory: Trajectory) -> float:
        return 0.0


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tokenizer()


async def _agent_loop(template: ChatTemplate, conversation: list[dict[str, Any]], tools: list[dict[str, Any]],
                      texts: list[str]) -> Any:
    client = ScriptedClient(template.tokenizer, [ScriptedTurn(t, logprob=0.0, weight_version=None) for t in texts])
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=512))
    return await run_episode(ReplayEnv(conversation, tools), template, client, config, group_id="g")


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
@pytest.mark.parametrize("which", sorted(CONVERSATIONS))
async def test_the_layout_equals_the_agent_loops(tok: Any, name: str, which: str) -> None:
    conversation, tools = CONVERSATIONS[which]
    template = ChatTemplate.from_name(name, tokenizer=tok)
    episode = TranscriptBuilder(template).episode(conversation, tools=tools, group_id="g")
    texts = [template.decode(seq.tokens[s.start:s.end]) for seq in episode.sequences for s in seq.segments
             if s.kind is SegmentKind.MODEL]
    assert len(texts) == sum(m["role"] == "assistant" for m in conversation)
    looped = await _agent_loop(template, conversation, tools, texts)
    assert looped.trajectory.metrics.get("bridge/sampled_text_differs", 0) == 0
    assert len(looped.sequences) == len(episode.sequences)
    for ours, theirs in zip(episode.sequences, looped.sequences, strict=True):
        assert ours.tokens == theirs.tokens
        assert ours.prompt_length == theirs.prompt_length
        assert ours.loss_mask == theirs.loss_mask
        assert ours.logprobs == theirs.logprobs
        assert ours.segments == theirs.segments
        assert [m.role for m in ours.messages] == [m.role for m in theirs.messages]
        assert (ours.status, ours.stop_reason) == (theirs.status, theirs.stop_reason)
        ours.validate()
    assert episode.sequences[-1].info["source"] == "transcript"


def test_assistant_tokens_are_trained_and_tool_results_are_not(tok: Any) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    episode = episode_from_messages(ARITHMETIC, template, tools=[CALC], group_id="g")
    (traj,) = episode.sequences
    assert [s.kind for s in traj.segments] == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.TOOL,
                                               SegmentKind.MODEL]
    # The buffer is the full render of the conversation (append-only), ending at the last turn close.
    assert template.decode(traj.tokens) + "\n" == template.render(ARITHMETIC, [CALC])
    tool = traj.segments[2]
    assert "450475" in template.decode(traj.tokens[tool.start:tool.end]) and not tool.trainable
    for seg in traj.segments[1:]:
        span = traj.loss_mask[seg.start - traj.prompt_length: seg.end - traj.prompt_length]
        assert span == [int(seg.kind is SegmentKind.MODEL)] * seg.length
    assert all(traj.tokens[s.end - 1] == template.turn_close_id for s in traj.segments_of(SegmentKind.MODEL))
    assert traj.reward is None and (traj.status, traj.stop_reason) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS)
    with pytest.raises(ValueError, match="reward"):
        build_training_batch([episode])  # SFT data never enters an RL batch by mistake


def test_a_user_follow_up_forks_where_the_template_rewrites_history(tok: Any) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    episode = episode_from_messages(FOLLOW_UP, template, tools=[CALC], group_id="g")
    assert len(episode.sequences) == 2
    first, second = episode.sequences
    assert "Powers of two." in template.decode(first.tokens)
    assert second.prompt_length == len(template.encode(FOLLOW_UP[:4], [CALC], add_generation_prompt=True))
    assert second.num_model_turns == 2 and second.sequence_index == 1
    episode.validate()


def test_trailing_replies_are_kept_unsent(tok: Any) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    episode = episode_from_messages(ARITHMETIC[:4], template, tools=[CALC])
    traj = episode.trajectory
    assert [s.kind for s in traj.segments] == [SegmentKind.PROMPT, SegmentKind.MODEL]
    assert traj.stop_reason is StopReason.ENV_DONE
    assert traj.info["unsent_messages"][0]["content"] == "450475"


@pytest.mark.parametrize(("conversation", "message"), [
    ([{"role": "user", "content": "hi"}], "no assistant message"),
    ([{"role": "assistant", "content": "hi"}], r"messages\[0\]: an assistant turn opens"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
     r"messages\[2\]: two assistant turns in a row"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}, {"role": "system", "content": "s"},
      {"role": "assistant", "content": "b"}], r"messages\[2\]: a system message after the opening"),
    ([{"role": "user", "content": "hi"}, {"role": "robot", "content": "a"}], r"messages\[1\]"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "1"}, {"role": "assistant", "content": "a"}],
     r"messages\[1\]: a tool message must answer an assistant turn"),
])
def test_conversations_that_cannot_be_laid_out_say_where(tok: Any, conversation: list[dict[str, Any]],
                                                        message: str) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    with pytest.raises(TranscriptError, match=message):
        episode_from_messages(conversation, template)
