"""The context policies as pure functions of a conversation (agentrl.rollout.context): what each keeps,
drops or elides, the thresholds, the registry, and the errors a bad setting gets."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agentrl.chat import Message
from agentrl.chat.types import ToolCall
from agentrl.rollout.context import (
    AskSummary,
    ContextView,
    ElideToolOutput,
    Rewrite,
    Summarize,
    Window,
    context_policy,
    turn_spans,
)


def _words(text: str) -> int:
    return len(text.split())


def _count(messages: Sequence[Message]) -> int:
    """A stand-in for the template's count: 2 tokens of framing a message plus a token a word."""
    return sum(2 + _words(str(m.content or "")) + 3 * len(m.tool_calls) for m in messages)


def _conversation(turns: int, words: int = 20) -> list[Message]:
    out = [Message(role="system", content="sys"), Message(role="user", content="task")]
    for k in range(1, turns + 1):
        out.append(Message(role="assistant", content="", tool_calls=[ToolCall("read", {"page": k}, f"c{k}")]))
        out.append(Message(role="tool", content=" ".join(["w"] * words) + f" code {k}", tool_call_id=f"c{k}",
                           name="read"))
    return out


def _view(messages: list[Message], trigger: int, target: int) -> ContextView:
    return ContextView(messages=tuple(messages), opening=2, pending=1, tokens=_count(messages), trigger=trigger,
                       target=target, context=None, count=_count, count_text=_words)


def test_turns_are_an_assistant_message_and_its_answers() -> None:
    msgs = _conversation(3)
    assert turn_spans(msgs, 2) == [(2, 4), (4, 6), (6, 8)]
    summary_first = [*msgs[:2], Message(role="user", content="summary"), *msgs[2:4]]
    assert turn_spans(summary_first, 2) == [(2, 3), (3, 5)]  # the summary that opens a sequence is a turn of its own


async def test_window_keeps_the_opening_and_the_last_turns_that_fit_the_target() -> None:
    msgs = _conversation(10)  # 10 turns of 2 + 3 + 2 + 22 = 29 "tokens", opening 4
    out = await Window().compact(_view(msgs, trigger=250, target=125))
    assert isinstance(out, Rewrite)
    # opening 4 + k turns of 29 <= 125: k = 4 (120 tokens); 5 would be 149
    assert out.messages[:2] == tuple(msgs[:2]) and out.messages[2:] == tuple(msgs[-8:])
    assert out.kept == (0, 1, *range(14, 22))
    assert dict(out.note) == {"dropped_turns": 6, "kept_turns": 4, "dropped_messages": 12}
    assert _count(out.messages) <= 125


async def test_window_caps_the_kept_turns_and_always_keeps_the_last_one() -> None:
    msgs = _conversation(10)
    capped = await Window(keep_turns=2).compact(_view(msgs, trigger=250, target=125))
    assert capped is not None and capped.messages[2:] == tuple(msgs[-4:])
    too_big = await Window().compact(_view(msgs, trigger=20, target=10))  # no turn fits: the last one stays
    assert too_big is not None and too_big.messages[2:] == tuple(msgs[-2:])
    assert await Window().compact(_view(_conversation(1), trigger=20, target=10)) is None  # nothing may go


async def test_elision_replaces_the_oldest_tool_outputs_first_and_spares_the_last_turns() -> None:
    msgs = _conversation(6, words=40)  # each tool output: 42 words
    view = _view(msgs, trigger=250, target=200)  # count is 4 + 6 * 49 = 298: 98 over the target
    out = await ElideToolOutput(keep_turns=2).compact(view)
    assert isinstance(out, Rewrite)
    elided = [i for i, (a, b) in enumerate(zip(msgs, out.messages, strict=True)) if a is not b]
    assert elided == [3, 5, 7]  # each saves 42 - 8 = 34 words: three are needed for 98
    assert out.messages[3].content == "[output of call c1 (read) elided, 42 tokens]"
    assert out.messages[3].tool_call_id == "c1" and out.messages[3].role == "tool"
    assert dict(out.note) == {"elided_messages": [3, 5, 7], "elided_calls": ["c1", "c2", "c3"]}
    assert 3 not in out.kept and 9 in out.kept
    again = await ElideToolOutput(keep_turns=2).compact(_view(list(out.messages), trigger=100, target=50))
    assert again is not None and [i for i in dict(again.note)["elided_messages"]] == [9]  # stubs are not elided twice
    assert await ElideToolOutput(keep_turns=6).compact(view) is None  # every turn is protected


async def test_summarize_asks_for_a_summary_then_opens_with_it() -> None:
    msgs = _conversation(4)
    view = _view(msgs, trigger=100, target=50)
    policy = Summarize(instruction="Write your notes.", max_tokens=64, prefix="Notes:\n")
    ask = await policy.compact(view)
    assert ask == AskSummary(Message(role="user", content="Write your notes."), 64)
    out = policy.after_summary(view, " p1=1 p2=2 \n")
    assert out.messages == (*msgs[:2], Message(role="user", content="Notes:\np1=1 p2=2"))
    assert out.kept == (0, 1) and dict(out.note) == {"summary": "p1=1 p2=2", "carried_messages": 0}
    carried = policy.after_summary(view, "p1=1", carried=tuple(msgs[-2:]))
    assert carried.messages[3:] == tuple(msgs[-2:])


async def test_a_separate_summarizer_writes_the_summary_and_nothing_is_asked() -> None:
    seen: list[int] = []

    async def summarizer(messages: Sequence[Message]) -> str:
        seen.append(len(messages))
        return "p1=1"

    msgs = _conversation(3)
    out = await Summarize(summarizer=summarizer).compact(_view(msgs, trigger=100, target=50))
    assert isinstance(out, Rewrite) and seen == [len(msgs)]
    assert out.messages[-1].content.endswith("p1=1") and dict(out.note)["summarizer"] == "separate"


def test_thresholds_in_tokens_or_fractions() -> None:
    assert Window(trigger=1000).thresholds(None) == (1000, 500)
    assert Window(trigger=0.75, target=0.4).thresholds(2048) == (1536, 614)
    assert Window(trigger=3000, target=200).thresholds(2048) == (2048, 200)  # never past the context
    with pytest.raises(ValueError, match=r"Window.trigger=0.75 is a fraction of the context, but the episode has no "
                                         r"context length"):
        Window(trigger=0.75).thresholds(None)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"trigger": 1.5}, r"Window.trigger: got 1.5; expected a token count >= 2 \(int\) or a fraction"),
    ({"trigger": True}, r"Window.trigger: got True"),
    ({"target": 1.0}, r"Window.target: got 1.0; expected a token count >= 1 \(int\) or a fraction of the trigger"),
    ({"trigger": 100, "target": 100}, r"Window.target: got 100; expected fewer tokens than trigger=100"),
    ({"keep_turns": 0}, r"Window.keep_turns: got 0; expected None or an int >= 1"),
])
def test_bad_window_settings_name_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Window(**kwargs)  # type: ignore[arg-type]


def test_bad_summarize_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"Summarize.max_tokens: got 0; expected an int >= 1"):
        Summarize(max_tokens=0)
    with pytest.raises(ValueError, match=r"Summarize.instruction: got ' '"):
        Summarize(instruction=" ")
    with pytest.raises(ValueError, match=r"Summarize.train_summary: got 'no'"):
        Summarize(train_summary="no")  # type: ignore[arg-type]


def test_the_registry_names_policies_and_their_settings() -> None:
    assert context_policy("none") is None
    assert context_policy("window", trigger=900, keep_turns=4) == Window(trigger=900, keep_turns=4)
    assert context_policy("summarize", train_summary=False) == Summarize(train_summary=False)
    with pytest.raises(ValueError, match=r"context policy 'windows': unknown; expected one of 'none', 'window', "
                                         r"'elide_tool_output', 'summarize'"):
        context_policy("windows")
    with pytest.raises(ValueError, match=r"'window': unknown setting\(s\) max_tokens; expected some of trigger, "
                                         r"target, keep_turns"):
        context_policy("window", max_tokens=10)
    with pytest.raises(ValueError, match=r"'none' takes no settings; got trigger"):
        context_policy("none", trigger=10)
    with pytest.raises(ValueError, match="summarizer"):  # a function cannot come from a config file
        context_policy("summarize", summarizer="my.module:fn")


def _config(environment: dict[str, object]) -> object:
    from agentrl.runner import RunConfig

    return RunConfig.from_dict({"model": {"path": "m"}, "data": {"train": {"path": "t"}},
                                "environment": {"name": "long_recall", **environment}, "train": {"steps": 1}})


def test_the_run_config_sets_budgets_and_the_policy_on_every_episode() -> None:
    import pickle

    from agentrl.environments.long_recall import LongRecallEnv, make_recall_rows
    from agentrl.runner.envs import environment_factory

    class Windowed(LongRecallEnv):
        default_context_policy = Window(trigger=900)

    row = make_recall_rows(1)[0]
    factory = environment_factory(_config({"limits": {"max_sampled_tokens": 3000, "max_turns": 40},
                                           "context": {"policy": "summarize", "trigger": 1100,
                                                       "train_summary": False}}))
    env = pickle.loads(pickle.dumps(factory))(row)  # the factory crosses into the rollout actor
    assert (env.limits.max_sampled_tokens, env.limits.max_turns, env.limits.max_tool_calls) == (3000, 40, 64)
    assert env.context_policy == Summarize(trigger=1100, train_summary=False)
    off = environment_factory(_config({"context": {"policy": "none"}}), environment=Windowed)(row)
    assert off.context_policy is None  # "none" turns the class's default off
    kept = environment_factory(_config({}), environment=Windowed)(row)
    assert kept.context_policy == Window(trigger=900) and kept.limits == LongRecallEnv.default_limits


@pytest.mark.parametrize(("environment", "message"), [
    ({"limits": {"max_turnz": 3}}, r"limits: unknown key\(s\) max_turnz; expected some of max_turns, max_tool_calls, "
                                   r"max_context_tokens, max_sampled_tokens"),
    ({"limits": {"max_sampled_tokens": 0}}, r"limits: EnvLimits.max_sampled_tokens: got 0; expected None or an "
                                            r"integer >= 1"),
    ({"context": {"trigger": 900}}, r"context.policy: got None; expected one of 'none', 'window'"),
    ({"context": {"policy": "window", "max_tokens": 9}}, r"context: context policy 'window': unknown setting\(s\) "
                                                         r"max_tokens"),
])
def test_bad_budgets_and_policies_in_a_run_config_name_the_key(environment: dict[str, object], message: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        _config(environment)


def test_a_config_without_budgets_or_a_policy_keeps_its_hash() -> None:
    plain, budgeted = _config({}), _config({"limits": {"max_turns": 40}})
    assert b'"limits"' not in plain.canonical_json() and b'"context"' not in plain.canonical_json()  # type: ignore[attr-defined]
    assert b'"limits":{"max_turns":40}' in budgeted.canonical_json()  # type: ignore[attr-defined]
    assert plain.hash() != budgeted.hash()  # type: ignore[attr-defined]
