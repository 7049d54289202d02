"""The agent loop against a scripted policy: every termination path, failure kind and policy, parallel
calls, forks, budgets — and token/mask/logprob/segment alignment after each.

The templates, parser, bridge, trajectory and tokenizer are the real ones; only the policy (the
scripted client) and the tools are fakes. tests/integration runs the loop with real tools.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentrl.chat import ChatTemplate, FailureKind, Message
from agentrl.environments import Environment, EnvLimits, FailurePolicy, StepResult
from agentrl.rewards import final_answer_text, math_answer_reward
from agentrl.rollout.agent import AgentConfig, Episode, run_episode
from agentrl.rollout.types import PromptTooLongError, SamplingParams
from agentrl.testing.scripted import ScriptedClient, ScriptedTurn
from agentrl.tools import ToolResult
from agentrl.trajectory import EpisodeError, ErrorKind, SegmentKind, Status, StopReason, Trajectory

LOGPROB = -0.25


@pytest.fixture(scope="module")
def qwen3(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=tok)


@pytest.fixture(scope="module")
def qwen3_5(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3_5", tokenizer=tok)


class Calc:
    """A fake tool (the real python/calculator tools run in tests/integration)."""

    name = "calc"
    description = "Run python."
    parameters: dict[str, Any] = {"type": "object", "properties": {"code": {"type": "string"}},  # noqa: RUF012
                                  "required": ["code"]}

    def __init__(self, delay_s: float = 0.0, error_kind: str | None = None) -> None:
        self.delay_s, self.error_kind = delay_s, error_kind
        self.spans: list[tuple[float, float]] = []  # (start, end) of each call, to see overlap

    async def __call__(self, code: str) -> Any:
        start = time.perf_counter()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.spans.append((start, time.perf_counter()))
        if self.error_kind:
            return ToolResult.error(FailureKind(self.error_kind), f"failed: {self.error_kind}")
        return str(eval(code.replace("print", "")))


class MathEnv(Environment):
    def __init__(self, task: Any, tool: Calc | None = None, **kw: Any) -> None:
        super().__init__(task, **kw)
        self.register_tool(tool or Calc())
        self.closed = 0

    async def reset(self) -> list[Message]:
        return [Message(role="user", content=self.task["q"])]

    def reward(self, trajectory: Trajectory) -> float:
        return math_answer_reward(final_answer_text(trajectory.messages), self.task["a"])

    async def close(self) -> None:
        self.closed += 1


def env(**kw: Any) -> MathEnv:
    return MathEnv({"q": "2**10?", "a": "1024"}, **kw)


def json_call(code: str = "print(2**10)", think: str = "Use code.") -> str:
    return (f"<think>\n{think}\n</think>\n\n<tool_call>\n{{\"name\": \"calc\", \"arguments\": {{\"code\": \"{code}\"}}}}"
            "\n</tool_call><|im_end|>")


def xml_call(code: str = "print(2**10)", think: str = "Use code.") -> str:
    return (f"{think}\n</think>\n\n<tool_call>\n<function=calc>\n<parameter=code>\n{code}\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>")


def answer(fmt: str, value: str = "1024") -> str:
    body = f"Done.\n</think>\n\n\\boxed{{{value}}}<|im_end|>"
    return body if fmt == "qwen3_5" else "<think>\n" + body


def assert_aligned(ep: Episode, tok: Any, script: list[str] | None = None) -> None:
    """Lengths, masks, logprobs and segments agree; model spans hold exactly the sampled ids."""
    for traj in ep.sequences:
        traj.validate()
        assert len(traj.tokens) == traj.prompt_length + len(traj.loss_mask) == traj.prompt_length + len(traj.logprobs)
        for seg in traj.segments[1:]:
            lo, hi = seg.start - traj.prompt_length, seg.end - traj.prompt_length
            if seg.kind is SegmentKind.MODEL:
                assert traj.loss_mask[lo:hi] == [1] * seg.length
                assert traj.logprobs[lo:hi] == [LOGPROB] * seg.length
            else:
                assert traj.loss_mask[lo:hi] == [0] * seg.length and traj.logprobs[lo:hi] == [0.0] * seg.length
    if script is not None:
        model = [s for t in ep.sequences for s in t.segments if s.kind is SegmentKind.MODEL]
        for seg, text, traj in zip(model, script, [t for t in ep.sequences for s in t.segments
                                                   if s.kind is SegmentKind.MODEL], strict=False):
            assert traj.tokens[seg.start:seg.end] == tok.encode(text, add_special_tokens=False)[:seg.length]


def assert_no_drift(ep: Episode, template: ChatTemplate, tools: list[dict[str, Any]]) -> None:
    """The token buffer equals a full render of the trajectory's messages (minus the final newline)."""
    traj = ep.trajectory
    full = template.encode(traj.messages, tools)
    assert template.decode(full).endswith("<|im_end|>\n")
    assert traj.tokens == full[:-1] or traj.tokens == full


async def run(e: MathEnv, template: ChatTemplate, client: ScriptedClient, **cfg: Any) -> Episode:
    sampling = cfg.pop("sampling", SamplingParams(max_new_tokens=256))
    return await run_episode(e, template, client, AgentConfig(sampling=sampling, **cfg), group_id="g")


# -- completed episodes ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["qwen3", "qwen3_5"])
async def test_tool_then_answer_completes_without_drift(fmt: str, tok: Any, request: Any) -> None:
    template = request.getfixturevalue(fmt)
    script = [json_call() if fmt == "qwen3" else xml_call(), answer(fmt)]
    client = ScriptedClient(tok, [ScriptedTurn(t, logprob=LOGPROB) for t in script])
    e = env()
    ep = await run(e, template, client)
    traj = ep.trajectory
    assert (traj.status, traj.stop_reason, traj.reward) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS, 1.0)
    assert [s.kind for s in traj.segments] == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.TOOL,
                                               SegmentKind.MODEL]
    assert [m.role for m in traj.messages] == ["user", "assistant", "tool", "assistant"]
    assert traj.messages[2].content == "1024" and traj.metrics["tool_calls"] == 1
    assert e.closed == 1
    assert_aligned(ep, tok, script)
    assert_no_drift(ep, template, e.tool_specs())
    tool_text = template.decode(traj.tokens[traj.segments[2].start:traj.segments[2].end])
    assert tool_text.startswith("\n<|im_start|>user\n<tool_response>\n1024\n</tool_response><|im_end|>\n")
    # the agent sent the whole buffer each turn, with one routing key and the template's stop ids
    assert client.requests[1].input_ids == tuple(traj.tokens[:traj.segments[3].start])
    assert len({r.routing_key for r in client.requests}) == 1
    assert all(r.sampling.stop_token_ids == (template.turn_close_id,) for r in client.requests)


async def test_immediate_answer_is_no_tool_calls(tok: Any, qwen3: ChatTemplate) -> None:
    ep = await run(env(), qwen3, ScriptedClient(tok, [answer("qwen3", "7")]))
    assert ep.stop_reason is StopReason.NO_TOOL_CALLS and ep.reward == 0.0
    assert_aligned(ep, tok)


async def test_parallel_calls_run_concurrently_in_one_tool_segment(tok: Any, qwen3: ChatTemplate) -> None:
    two = ("<think>\nBoth.\n</think>\n\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"code\": \"1+1\"}}\n</tool_call>\n"
           "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"code\": \"2+2\"}}\n</tool_call><|im_end|>")
    calc = Calc(delay_s=0.2)
    e = env(tool=calc)
    ep = await run(e, qwen3, ScriptedClient(tok, [two, answer("qwen3")]))
    first, second = sorted(calc.spans)
    assert second[0] < first[1], "the second call started only after the first had finished: not concurrent"
    traj = ep.trajectory
    assert [m.content for m in traj.messages if m.role == "tool"] == ["2", "4"]
    tool_segs = traj.segments_of(SegmentKind.TOOL)
    assert len(tool_segs) == 1
    text = qwen3.decode(traj.tokens[tool_segs[0].start:tool_segs[0].end])
    assert text.count("<tool_response>") == 2 and text.count("<|im_start|>user") == 1
    assert_aligned(ep, tok)
    assert_no_drift(ep, qwen3, e.tool_specs())


async def test_one_call_per_turn_adds_a_synthetic_turn_close(tok: Any, qwen3: ChatTemplate) -> None:
    call_then_more = json_call().replace("<|im_end|>", "\nI predict 1024.<|im_end|>")
    e = env()
    ep = await run(e, qwen3, ScriptedClient(tok, [call_then_more, answer("qwen3")]), one_call_per_turn=True)
    traj = ep.trajectory
    kinds = [s.kind for s in traj.segments]
    assert kinds == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.SCAFFOLD, SegmentKind.TOOL, SegmentKind.MODEL]
    scaffold = traj.segments[2]
    assert traj.tokens[scaffold.start:scaffold.end] == [qwen3.turn_close_id]
    assert qwen3.decode(traj.tokens[traj.segments[1].start:traj.segments[1].end]).endswith("</tool_call>")
    assert_aligned(ep, tok)
    assert_no_drift(ep, qwen3, e.tool_specs())


# -- limits -----------------------------------------------------------------------------------------
async def test_max_turns(tok: Any, qwen3: ChatTemplate) -> None:
    e = env(limits=EnvLimits(max_turns=2))
    ep = await run(e, qwen3, ScriptedClient(tok, [json_call(), json_call(think="Again.")]))
    assert (ep.status, ep.stop_reason) == (Status.COMPLETED, StopReason.MAX_TURNS)
    assert ep.trajectory.info["unsent_messages"][0]["content"] == "1024"
    assert ep.trajectory.num_model_turns == 2
    assert_aligned(ep, tok)


async def test_max_tool_calls(tok: Any, qwen3: ChatTemplate) -> None:
    e = env(limits=EnvLimits(max_tool_calls=1))
    ep = await run(e, qwen3, ScriptedClient(tok, [json_call(), json_call(think="More.")]))
    assert (ep.status, ep.stop_reason) == (Status.COMPLETED, StopReason.MAX_TOOL_CALLS)
    assert e.tool_calls == 1 and ep.env_info[-1]["tool_calls_skipped"] == 1
    assert_aligned(ep, tok)


async def test_context_budget_caps_every_request_and_truncates_without_a_request(tok: Any, qwen3: ChatTemplate) -> None:
    e = env()
    prompt_len = len(qwen3.encode(await e.reset(), e.tool_specs(), add_generation_prompt=True))
    first = len(tok.encode(json_call(), add_special_tokens=False))
    context = prompt_len + first + 18  # room for the tool segment (17 ids) and exactly one more token
    client = ScriptedClient(tok, [json_call(), answer("qwen3")])
    ep = await run(env(), qwen3, client, context_length=context)
    for req in client.requests:
        assert req.sampling.max_new_tokens <= context - len(req.input_ids)
    assert (ep.status, ep.stop_reason) == (Status.TRUNCATED, StopReason.CONTEXT_BUDGET)
    assert len(ep.trajectory.tokens) <= context
    assert_aligned(ep, tok)


async def test_environment_budget_stops_before_a_request_when_nothing_fits(tok: Any, qwen3: ChatTemplate) -> None:
    e = env()
    prompt_len = len(qwen3.encode(await e.reset(), e.tool_specs(), add_generation_prompt=True))
    first = len(tok.encode(json_call(), add_special_tokens=False))
    tool_seg = 17
    client = ScriptedClient(tok, [json_call(), answer("qwen3")])
    limited = env(limits=EnvLimits(max_context_tokens=prompt_len + first + tool_seg))
    ep = await run(limited, qwen3, client)
    assert ep.stop_reason is StopReason.CONTEXT_BUDGET and len(client.requests) == 1
    assert ep.trajectory.info["unsent_messages"][0]["content"] == "1024"  # the tool result did not fit
    assert_aligned(ep, tok)


async def test_length_cut_by_the_context_is_context_budget(tok: Any, qwen3: ChatTemplate) -> None:
    e = env()
    prompt_len = len(qwen3.encode(await e.reset(), e.tool_specs(), add_generation_prompt=True))
    client = ScriptedClient(tok, [json_call()])
    ep = await run(env(), qwen3, client, context_length=prompt_len + 5)
    assert client.requests[0].sampling.max_new_tokens == 5
    assert (ep.status, ep.stop_reason) == (Status.TRUNCATED, StopReason.CONTEXT_BUDGET)
    assert ep.trajectory.response_length == 5 and ep.trajectory.info["last_message_partial"]
    assert_aligned(ep, tok, [json_call()])


async def test_engine_length_limit(tok: Any, qwen3: ChatTemplate) -> None:
    client = ScriptedClient(tok, [json_call()])
    ep = await run(env(), qwen3, client, sampling=SamplingParams(max_new_tokens=6))
    assert (ep.status, ep.stop_reason) == (Status.TRUNCATED, StopReason.ENGINE_LENGTH)
    assert ep.trajectory.segments[-1].finish_reason == "length" and ep.trajectory.response_length == 6
    assert ep.reward == 0.0
    assert_aligned(ep, tok, [json_call()])


async def test_prompt_too_long_from_the_engine_is_context_budget_after_the_first_turn(tok: Any,
                                                                                      qwen3: ChatTemplate) -> None:
    class RejectingLater(ScriptedClient):
        async def generate(self, input_ids: Any, sampling: Any, **kw: Any) -> Any:
            if self.requests:
                raise PromptTooLongError(400, "too long", "http://127.0.0.1:1/generate")
            return await super().generate(input_ids, sampling, **kw)

    ep = await run(env(), qwen3, RejectingLater(tok, [json_call(), answer("qwen3")]))
    assert (ep.status, ep.stop_reason) == (Status.TRUNCATED, StopReason.CONTEXT_BUDGET)
    [error] = ep.trajectory.errors
    assert error.kind is ErrorKind.PROMPT_TOO_LONG and "too long" in error.message


async def test_an_opening_prompt_that_cannot_fit_fails_the_episode_saying_so(tok: Any, qwen3: ChatTemplate) -> None:
    class Rejecting(ScriptedClient):
        async def generate(self, input_ids: Any, sampling: Any, **kw: Any) -> Any:
            raise PromptTooLongError(400, "too long", "http://127.0.0.1:1/generate")

    ep = await run(env(), qwen3, Rejecting(tok, []))  # the engine refuses it: nothing was sampled
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED)
    [error] = ep.trajectory.errors
    assert error.kind is ErrorKind.PROMPT_TOO_LONG and "prompt too long" in error.message and "refused" in error.message
    e = env()
    prompt_len = len(qwen3.encode(await e.reset(), e.tool_specs(), add_generation_prompt=True))
    client = ScriptedClient(tok, [answer("qwen3")])
    ep = await run(env(), qwen3, client, context_length=prompt_len)  # the agent knows the context: no request
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED) and not client.requests
    [error] = ep.trajectory.errors
    assert error.kind is ErrorKind.PROMPT_TOO_LONG
    assert f"opening prompt has {prompt_len} tokens and the context holds {prompt_len}" in error.message


# -- abort and failure -----------------------------------------------------------------------------
async def test_abort_flag_is_checked_before_every_request(tok: Any, qwen3: ChatTemplate) -> None:
    client = ScriptedClient(tok, [json_call(), answer("qwen3")])
    ep = await run_episode(env(), qwen3, client, should_abort=lambda: len(client.requests) >= 1)
    assert (ep.status, ep.stop_reason) == (Status.ABORTED, StopReason.ABORTED)
    assert len(client.requests) == 1 and ep.reward is None  # aborted episodes are not scored
    assert_aligned(ep, tok)


async def test_engine_abort_keeps_the_partial_turn(tok: Any, qwen3: ChatTemplate) -> None:
    client = ScriptedClient(tok, [ScriptedTurn(json_call()[:20], finish="abort")])
    ep = await run(env(), qwen3, client)
    assert (ep.status, ep.stop_reason) == (Status.ABORTED, StopReason.ABORTED)
    assert ep.trajectory.segments[-1].finish_reason == "abort" and ep.trajectory.response_length > 0
    assert_aligned(ep, tok)


async def test_cancellation_aborts_the_request_and_closes_the_env(tok: Any, qwen3: ChatTemplate) -> None:
    client = ScriptedClient(tok, [ScriptedTurn(json_call(), delay_s=5)])
    e = env()
    task = asyncio.create_task(run(e, qwen3, client))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.aborted == [client.requests[0].rid] and e.closed == 1


async def test_missing_logprobs_fail_without_appending(tok: Any, qwen3: ChatTemplate) -> None:
    ep = await run(env(), qwen3, ScriptedClient(tok, [ScriptedTurn(json_call(), drop_logprobs=True)]))
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED)
    [error] = ep.trajectory.errors
    assert ep.trajectory.response_length == 0 and error.kind is ErrorKind.ENGINE_OUTPUT and "logprobs" in error.message


async def test_environment_exception_fails_the_episode(tok: Any, qwen3: ChatTemplate) -> None:
    class Broken(MathEnv):
        async def step(self, reply: Message, failures: Any = ()) -> StepResult:
            raise RuntimeError("env bug")

    e = Broken({"q": "x", "a": "1"})
    ep = await run(e, qwen3, ScriptedClient(tok, [json_call()]))
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED)
    assert ep.trajectory.errors == [EpisodeError(ErrorKind.ENV, "RuntimeError: env bug", turn=1, component="step")]
    assert e.closed == 1
    assert_aligned(ep, tok)


# -- every failure kind, every policy ----------------------------------------------------------------
_PARSE_FAILURES = {
    FailureKind.MALFORMED_JSON: '<tool_call>\n{"name": "calc", "arguments": {"code": "1",}}\n</tool_call><|im_end|>',
    FailureKind.UNKNOWN_TOOL: '<tool_call>\n{"name": "nope", "arguments": {"code": "1"}}\n</tool_call><|im_end|>',
    FailureKind.UNTERMINATED: '<tool_call>\n{"name": "calc", "arguments": {"code": "1"}}<|im_end|>',
    FailureKind.MISSING_REQUIRED_ARGUMENT: '<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call><|im_end|>',
    FailureKind.INVALID_ARGUMENT_TYPE: '<tool_call>\n{"name": "calc", "arguments": {"code": 5}}\n</tool_call><|im_end|>',
    FailureKind.EMPTY_CALL: "<tool_call>\n\n</tool_call><|im_end|>",
    FailureKind.TEXT_AFTER_CALL: '<tool_call>\n{"name": "calc", "arguments": {"code": "1"}}\n</tool_call>\nso 1<|im_end|>',
    FailureKind.TOO_MANY_CALLS: ('<tool_call>\n{"name": "calc", "arguments": {"code": "1"}}\n</tool_call>\n'
                                 '<tool_call>\n{"name": "calc", "arguments": {"code": "2"}}\n</tool_call><|im_end|>'),
}
_XML_PARSE_FAILURES = {
    FailureKind.MALFORMED_XML: "<tool_call>\n<function=ca<lc>\n</function>\n</tool_call><|im_end|>",
}
_TOOL_FAILURES = (FailureKind.TOOL_ERROR, FailureKind.TOOL_TIMEOUT, FailureKind.SANDBOX_ERROR)


@pytest.mark.parametrize("policy", ["feedback", "penalize", "end"])
@pytest.mark.parametrize("kind", list(FailureKind))
async def test_every_failure_kind_under_every_policy(kind: FailureKind, policy: str, tok: Any,
                                                    qwen3: ChatTemplate, qwen3_5: ChatTemplate) -> None:
    fmt, template = ("qwen3_5", qwen3_5) if kind in _XML_PARSE_FAILURES else ("qwen3", qwen3)
    if kind in _TOOL_FAILURES:
        first, tool = json_call("1"), Calc(error_kind=kind.value)
    elif kind in _XML_PARSE_FAILURES:
        first, tool = "Try.\n</think>\n\n" + _XML_PARSE_FAILURES[kind], Calc()
    else:
        first, tool = "<think>\nTry.\n</think>\n\n" + _PARSE_FAILURES[kind], Calc()
    e = MathEnv({"q": "2**10?", "a": "1024"}, tool=tool,
                failure_policy=FailurePolicy(overrides={kind: policy}, penalty=-0.3))
    client = ScriptedClient(tok, [first, answer(fmt)])
    ep = await run(e, template, client, max_calls_per_turn=1)
    traj = ep.trajectory
    assert traj.metrics[f"failures/{kind.value}"] == 1
    assert_aligned(ep, tok)
    if policy == "end":
        assert (traj.status, traj.stop_reason, traj.reward) == (Status.FAILED, StopReason.FAILED, 0.0)
        assert len(client.requests) == 1
        return
    assert (traj.status, traj.stop_reason) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS)
    feedback = [m for m in traj.messages if m.role == "tool"]
    assert any(kind.value in str(m.content) for m in feedback)
    tool_seg = traj.segments_of(SegmentKind.TOOL)[0]
    assert kind.value in template.decode(traj.tokens[tool_seg.start:tool_seg.end])  # the model sees the error
    expected = 1.0 + (-0.3 if policy == "penalize" else 0.0)
    assert traj.reward == pytest.approx(expected)
    assert ("failure_penalty" in traj.reward_parts) == (policy == "penalize")


_REJECTED = [FailureKind.MALFORMED_JSON, FailureKind.UNKNOWN_TOOL, FailureKind.MISSING_REQUIRED_ARGUMENT,
             FailureKind.INVALID_ARGUMENT_TYPE, FailureKind.EMPTY_CALL, FailureKind.MALFORMED_XML]


@pytest.mark.parametrize("kind", _REJECTED)
async def test_a_rejected_call_stays_in_the_conversation_as_the_model_wrote_it(kind: FailureKind, tok: Any,
                                                                             qwen3: ChatTemplate,
                                                                             qwen3_5: ChatTemplate) -> None:
    xml = kind in _XML_PARSE_FAILURES
    template, fmt = (qwen3_5, "qwen3_5") if xml else (qwen3, "qwen3")
    call = (_XML_PARSE_FAILURES if xml else _PARSE_FAILURES)[kind]
    first = ("Try.\n</think>\n\n" if xml else "<think>\nTry.\n</think>\n\n") + "Let me call it.\n\n" + call
    e = env()
    ep = await run(e, template, ScriptedClient(tok, [first, answer(fmt)]))
    traj = ep.trajectory
    assert (traj.status, traj.stop_reason) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS)
    reply = traj.messages[1]
    assert reply.tool_calls == [] and reply.content == "Let me call it.\n\n" + call.removesuffix("<|im_end|>")
    # the conversation re-renders to exactly the sampled tokens: no fork, nothing re-rendered differently
    assert len(ep.sequences) == 1 and traj.metrics["bridge/append"] == 1
    assert traj.metrics.get("bridge/sampled_text_differs", 0) == 0 and "bridge/fork" not in traj.metrics
    assert_no_drift(ep, template, e.tool_specs())
    tool_seg = traj.segments_of(SegmentKind.TOOL)[0]
    before_error = template.decode(traj.tokens[:tool_seg.start])
    assert before_error.endswith(call)  # the model's own mistake right before the error it gets back


# -- not append-only: fork ---------------------------------------------------------------------------
class FollowUpEnv(MathEnv):
    """Asks a second question after the first answer: a new user query rewrites Qwen3 history."""

    async def step(self, reply: Message, failures: Any = ()) -> StepResult:
        if self.turns == 0 and not reply.tool_calls:
            self._begin_step()
            return StepResult(messages=[Message(role="user", content="And 2**11?")])
        return await super().step(reply, failures)


async def test_a_new_user_query_forks_a_new_sequence(tok: Any, qwen3: ChatTemplate) -> None:
    e = FollowUpEnv({"q": "2**10?", "a": "2048"})
    ep = await run(e, qwen3, ScriptedClient(tok, [answer("qwen3", "1024"), answer("qwen3", "2048")]))
    assert len(ep.sequences) == 2 and ep.trajectory.metrics["bridge/fork"] == 1
    first, second = ep.sequences
    assert first.status is second.status is Status.COMPLETED and first.reward == second.reward == 1.0
    assert second.sequence_index == 1 and second.rollout_id == first.rollout_id
    assert second.tokens[:second.prompt_length] == qwen3.encode(second.messages[:3], e.tool_specs(),
                                                                 add_generation_prompt=True)
    assert "<think>" not in qwen3.decode(second.tokens[:second.prompt_length]).split("assistant")[-2]
    assert_aligned(ep, tok)


async def test_sampled_text_that_re_renders_differently_is_kept_and_counted(tok: Any, qwen3: ChatTemplate) -> None:
    compact = ('<think>\nUse code.\n</think>\n\n<tool_call>\n{"name":"calc","arguments":{"code":"print(2**10)"}}\n'
               "</tool_call><|im_end|>")
    script = [compact, json_call(think="Check."), answer("qwen3")]
    e = env()
    ep = await run(e, qwen3, ScriptedClient(tok, script))
    traj = ep.trajectory
    assert (traj.status, traj.stop_reason, traj.reward) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS, 1.0)
    assert traj.metrics["bridge/sampled_text_differs"] == 1 and traj.metrics["bridge/append"] == 2
    model = traj.segments_of(SegmentKind.MODEL)
    assert traj.tokens[model[0].start:model[0].end] == tok.encode(compact, add_special_tokens=False)  # verbatim
    # the buffer differs from a full render exactly where the model's own spacing was kept
    full = qwen3.render(traj.messages, e.tool_specs())
    sampled, canonical = '{"name":"calc","arguments":{"code":"print(2**10)"}}', json_call().split("\n")[5]
    assert canonical == '{"name": "calc", "arguments": {"code": "print(2**10)"}}'
    assert qwen3.decode(traj.tokens) != full[:-1]
    assert qwen3.decode(traj.tokens).replace(sampled, canonical, 1) + "\n" == full
    assert_aligned(ep, tok, script)


async def test_an_engine_answer_breaking_an_invariant_fails_without_appending(tok: Any, qwen3: ChatTemplate) -> None:
    ep = await run(env(), qwen3, ScriptedClient(tok, [ScriptedTurn(json_call(), logprob=0.5)]))
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED)
    [error] = ep.trajectory.errors
    assert ep.trajectory.response_length == 0 and "logprobs[0] = 0.5" in error.message
    assert error.kind is ErrorKind.ENGINE_OUTPUT


async def test_routing_key_scope(tok: Any, qwen3: ChatTemplate) -> None:
    per_group = ScriptedClient(tok, [json_call(), answer("qwen3")])
    await run(env(), qwen3, per_group, routing="group")
    assert {r.routing_key for r in per_group.requests} == {"g"}
    a, b = ScriptedClient(tok, [answer("qwen3")]), ScriptedClient(tok, [answer("qwen3")])
    await run(env(), qwen3, a)
    await run(env(), qwen3, b)
    assert a.requests[0].routing_key != b.requests[0].routing_key  # per episode by default
    extra = ScriptedClient(tok, [answer("qwen3")])
    await run(env(), qwen3, extra, sampling=SamplingParams(max_new_tokens=64, stop_token_ids=(7,)))
    assert extra.requests[0].sampling.stop_token_ids == (qwen3.turn_close_id, 7)
    with pytest.raises(ValueError, match=r"AgentConfig\.routing: got 'node'"):
        AgentConfig(routing="node")


async def test_environment_ending_for_its_own_reasons_is_env_done(tok: Any, qwen3: ChatTemplate) -> None:
    class OneShot(MathEnv):
        async def step(self, reply: Message, failures: Any = ()) -> StepResult:
            self._begin_step()
            self.done = True
            return StepResult(messages=[Message(role="user", content="Thanks, bye.")], done=True)

    ep = await run(OneShot({"q": "2**10?", "a": "1024"}), qwen3, ScriptedClient(tok, [json_call()]))
    assert (ep.status, ep.stop_reason) == (Status.COMPLETED, StopReason.ENV_DONE)
    assert ep.trajectory.info["unsent_messages"] == [{"role": "user", "content": "Thanks, bye."}]
    assert_aligned(ep, tok, [json_call()])
