"""A proxy session's token path against scripted engines: the same tokens as the agent loop, sampled
ids reused for replies the harness re-serialised, forks only where history really changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from _proxy_support import ADD, ANSWER, CALL, call_then_answer

from agentrl.chat import ChatTemplate, Message
from agentrl.chat.types import ToolCallFailure
from agentrl.environments import Environment, StepResult
from agentrl.proxy import ProxyConfig, ProxySession, RequestError, SessionError, parse_request
from agentrl.rollout import AgentConfig, SamplingParams, run_episode
from agentrl.testing.policy import FakePolicyClient
from agentrl.testing.scripted import ScriptedClient
from agentrl.trajectory import ForkReason, SegmentKind, StopReason, Trajectory

CONFIG = AgentConfig(sampling=SamplingParams(max_new_tokens=64), reward_pool=False)
OPENING = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "1+2?"}]
THINK_CALL = '<think>\nI add.\n</think>\n\n' + CALL
THINK_ANSWER = "<think>\nDone.\n</think>\n\nIt is 3.<|im_end|>"
FOLLOW_UP = {"role": "user", "content": "And 2+2?"}


class ScriptEnv(Environment):
    """The opening, then per model turn the scripted messages (a tool result answers the turn's call)."""

    def __init__(self, replies: list[list[dict[str, Any]]]) -> None:
        super().__init__({})
        self.replies = replies

    def tool_specs(self) -> list[dict[str, Any]]:
        return [ADD]

    async def reset(self) -> list[Message]:
        return [Message.from_dict(m) for m in OPENING]

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        self._begin_step()
        if self.turns > len(self.replies):
            return self._finish(StepResult(), StopReason.ENV_DONE)
        new = [dict(m, tool_call_id=reply.tool_calls[0].id) if m["role"] == "tool" else m for m in self.replies[self.turns - 1]]
        return StepResult(messages=[Message.from_dict(m) for m in new])

    def reward(self, trajectory: Trajectory) -> float:
        return 0.0


async def drive(session: ProxySession, replies: list[list[dict[str, Any]]], *, resend: Any = None) -> list[Any]:
    """A harness: the opening, then after each reply the reply (as the client returned it, or as
    ``resend`` rewrites it) and the scripted messages; stops after the last reply. Parsed as the server
    parses, with the session's memo."""
    messages: list[dict[str, Any]] = [dict(m) for m in OPENING]
    answers = []
    for turn in range(len(replies) + 1):
        reply = await session.handle(parse_request({"messages": messages, "tools": [ADD]}, session.memo))
        answers.append(reply)
        if turn == len(replies):
            break
        sent = resend(reply.message()) if resend is not None else reply.message()
        messages.append(sent)
        call_id = sent["tool_calls"][0]["id"] if sent.get("tool_calls") else reply.calls[0][0] if reply.calls else None
        for m in replies[turn]:  # a tool result answers the call id the harness holds
            if m["role"] == "tool" and not sent.get("tool_calls"):  # calls sent back as text: results as text too
                messages.append({"role": "user", "content": f"Observation:\n{m['content']}"})
            else:
                messages.append(dict(m, tool_call_id=call_id) if m["role"] == "tool" else dict(m))
    return answers


def same_tokens(a: Trajectory, b: Trajectory) -> None:
    assert a.tokens == b.tokens and a.prompt_length == b.prompt_length
    assert a.loss_mask == b.loss_mask and a.logprobs == b.logprobs
    strip = [dataclasses.replace(s, message_index=None) for s in a.segments]
    assert strip == [dataclasses.replace(s, message_index=None) for s in b.segments]


SCRIPT = [THINK_CALL, THINK_ANSWER, "4<|im_end|>"]
REPLIES = [[{"role": "tool", "content": "3"}], [FOLLOW_UP]]


@pytest.mark.parametrize("audit", [False, True])
async def test_a_conversation_the_agent_loop_can_drive_gives_the_same_sequences(template: ChatTemplate,
                                                                                audit: bool) -> None:
    config = dataclasses.replace(CONFIG, audit=audit)
    looped = await run_episode(ScriptEnv(REPLIES), template, ScriptedClient(template.tokenizer, SCRIPT), config)
    scripted = ScriptedClient(template.tokenizer, SCRIPT)
    session = ProxySession(template, scripted, config)
    await drive(session, REPLIES)
    proxied = session.finish(StopReason.ENV_DONE)
    # the follow-up user turn strips the earlier reasoning (Qwen3): both fork there, the same way
    assert len(looped.sequences) == len(proxied.sequences) == 2
    for a, b in zip(looped.sequences, proxied.sequences, strict=True):
        same_tokens(a, b)
    assert proxied.sequences[1].info["forked_because"].startswith("template: ")
    assert session.metrics["bridge/sampled_text_differs"] == looped.trajectory.metrics.get("bridge/sampled_text_differs", 0) == 0
    # every prompt sent to the engine is the full render of the conversation so far (no drift)
    for request, traj in zip(scripted.requests, [proxied.sequences[0]] * 2 + [proxied.sequences[1]], strict=True):
        upto = next(s.start for s in traj.segments if s.kind is SegmentKind.MODEL and s.start >= len(request.input_ids))
        assert list(request.input_ids) == traj.tokens[:upto]


def harness_style(sent: dict[str, Any]) -> dict[str, Any]:
    """What real harnesses send back: reasoning dropped, arguments re-serialised with other spacing."""
    out = {k: v for k, v in sent.items() if k != "reasoning_content"}
    if "tool_calls" in out:
        out["tool_calls"] = [{**c, "function": {**c["function"], "arguments": '{"b":2,"a":1}'}} for c in out["tool_calls"]]
    return out


def without_ids(sent: dict[str, Any]) -> dict[str, Any]:
    """A harness that regenerates call ids: only the content and calls are left to recognise the reply."""
    out = harness_style(sent)
    for c in out.get("tool_calls", []):
        c["id"] = "mine"
    return out


def as_text(sent: dict[str, Any]) -> dict[str, Any]:
    """smolagents: the calls re-serialised into the content, no tool_calls (and the results as user turns)."""
    return {"role": "assistant", "content": f"Calling tools:\n{sent.get('tool_calls')}"}


@pytest.mark.parametrize(("resend", "how"), [(harness_style, "call_ids"), (without_ids, "content"),
                                            (as_text, "call_ids_in_text")])
async def test_a_reply_sent_back_rewritten_is_recognised_and_its_sampled_ids_reused(
        template: ChatTemplate, resend: Any, how: str) -> None:
    client = FakePolicyClient(template.tokenizer, call_then_answer)
    session = ProxySession(template, client, CONFIG)
    replies = [[{"role": "tool", "content": "3"}]]
    await drive(session, replies, resend=resend)
    episode = session.finish(StopReason.ENV_DONE)
    assert len(episode.sequences) == 1 and session.metrics["proxy/forks"] == 0
    assert session.metrics[f"proxy/recognised/{how}"] == 1
    traj = episode.trajectory
    first = traj.segments_of(SegmentKind.MODEL)[0]
    assert traj.tokens[first.start:first.end] == list(template.tokenize(CALL))  # the sampled ids, verbatim
    assert list(client.requests[1].input_ids) == traj.tokens[:traj.segments_of(SegmentKind.MODEL)[1].start]


async def test_a_truncated_history_forks_a_new_sequence_from_the_harness_messages(template: ChatTemplate) -> None:
    client = FakePolicyClient(template.tokenizer, call_then_answer)
    session = ProxySession(template, client, CONFIG)
    first = await session.handle(parse_request({"messages": OPENING, "tools": [ADD]}))
    cut = [OPENING[1], first.message(), {"role": "tool", "tool_call_id": first.calls[0][0], "content": "3"}]
    await session.handle(parse_request({"messages": cut, "tools": [ADD]}))  # the system prompt dropped
    episode = session.finish(StopReason.ENV_DONE)
    assert len(episode.sequences) == 2 and [s.sequence_index for s in episode.sequences] == [0, 1]
    assert episode.sequences[1].info["forked_because"].startswith("harness: messages[0]")
    assert episode.trajectory.metrics["proxy/fork_rate"] == 1.0 and session.metrics["proxy/fork/harness"] == 1
    # the fork's prompt is the full render of what the harness sent; both sequences train their own turn
    assert episode.sequences[1].tokens[:episode.sequences[1].prompt_length] == template.encode(
        [Message.from_dict(m) for m in cut], [ADD], add_generation_prompt=True)
    assert [s.num_trainable_tokens > 0 for s in episode.sequences] == [True, True]
    assert {s.rollout_id for s in episode.sequences} == {session.rollout_id}


async def test_a_retry_gets_the_same_reply_and_a_second_request_samples_again(template: ChatTemplate) -> None:
    client = FakePolicyClient(template.tokenizer, call_then_answer)
    session = ProxySession(template, client, CONFIG)
    request = parse_request({"messages": OPENING, "tools": [ADD]})
    first = await session.handle(request)
    again = await session.handle(request, retry=True)
    assert again is first and len(client.requests) == 1 and session.metrics["proxy/retries_served"] == 1
    other = await session.handle(request)
    assert other.response_id != first.response_id and len(client.requests) == 2
    assert session.sequences[1].info["forked_because"].startswith("resampled")


async def test_two_conversations_in_one_session_each_continue_their_own_sequence(template: ChatTemplate) -> None:
    client = FakePolicyClient(template.tokenizer, call_then_answer)
    session = ProxySession(template, client, CONFIG)
    a = [{"role": "user", "content": "first"}]
    b = [{"role": "user", "content": "second"}]
    ra = await session.handle(parse_request({"messages": a, "tools": [ADD]}))
    rb = await session.handle(parse_request({"messages": b, "tools": [ADD]}))
    for msgs, reply in ((a, ra), (b, rb)):
        await session.handle(parse_request({"messages": [*msgs, reply.message(), {
            "role": "tool", "tool_call_id": reply.calls[0][0], "content": "3"}], "tools": [ADD]}))
    assert len(session.sequences) == 2 and session.metrics["bridge/append"] == 2
    assert [s.num_model_turns for s in session.sequences] == [2, 2]


async def test_forced_tool_choice_needs_constrained_decoding_and_then_sends_a_grammar(template: ChatTemplate) -> None:
    body = {"messages": OPENING, "tools": [ADD], "tool_choice": "required"}
    plain = ProxySession(template, FakePolicyClient(template.tokenizer, call_then_answer), CONFIG)
    with pytest.raises(RequestError, match="constrained decoding") as info:
        await plain.handle(parse_request(body))
    assert info.value.status == 400 and plain.metrics["proxy/bad_requests"] == 1
    scripted = ScriptedClient(template.tokenizer, [CALL])
    forced = ProxySession(template, scripted, CONFIG, ProxyConfig(constrained_decoding=True))
    reply = await forced.handle(parse_request(body))
    grammar = scripted.requests[0].sampling.ebnf
    assert grammar is not None and '\\"name\\": \\"add\\"' in grammar and reply.finish_reason == "tool_calls"
    named = {**body, "tool_choice": {"type": "function", "function": {"name": "add"}}}
    with pytest.raises(RequestError, match="qwen3"):  # XML calls have no grammar here
        xml = ChatTemplate.from_name("qwen3_5", template.tokenizer)
        await ProxySession(xml, scripted, CONFIG, ProxyConfig(constrained_decoding=True)).handle(parse_request(named))


async def test_sampling_is_pinned_to_the_run_unless_configured_otherwise(template: ChatTemplate) -> None:
    body = {"messages": OPENING, "temperature": 0.2, "top_p": 0.5, "max_tokens": 9, "stop": ["zz"]}
    pinned_client = ScriptedClient(template.tokenizer, [ANSWER])
    pinned = ProxySession(template, pinned_client, CONFIG)
    await pinned.handle(parse_request(body))
    sent = pinned_client.requests[0].sampling
    assert (sent.temperature, sent.top_p, sent.max_new_tokens, sent.stop) == (1.0, 1.0, 9, ("zz",))
    assert pinned.metrics["proxy/ignored_sampling"] == 1
    free_client = ScriptedClient(template.tokenizer, [ANSWER])
    await ProxySession(template, free_client, CONFIG, ProxyConfig(pin_sampling=False)).handle(parse_request(body))
    assert (free_client.requests[0].sampling.temperature, free_client.requests[0].sampling.top_p) == (0.2, 0.5)


async def test_a_stop_string_is_left_out_of_the_reply_but_kept_in_the_tokens(template: ChatTemplate) -> None:
    class StopClient(ScriptedClient):
        async def generate(self, input_ids: Any, sampling: SamplingParams, **kw: Any) -> Any:
            result = await super().generate(input_ids, sampling, **kw)
            return dataclasses.replace(result, finish_reason=dataclasses.replace(result.finish_reason, matched="Obs:"))

    client = StopClient(template.tokenizer, ["Thinking. Obs:", ANSWER])
    session = ProxySession(template, client, CONFIG)
    first = await session.handle(parse_request({"messages": OPENING, "stop": ["Obs:"]}))
    assert first.content == "Thinking." and first.finish_reason == "stop"
    await session.handle(parse_request({"messages": [*OPENING, {"role": "assistant", "content": "Thinking."},
                                                     {"role": "user", "content": "go on"}]}))
    traj = session.sequences[0]
    assert len(session.sequences) == 1 and template.decode(traj.tokens).count("Thinking. Obs:") == 1
    assert traj.segments_of(SegmentKind.SCAFFOLD), "the turn did not end with <|im_end|>: a synthetic one closes it"


async def test_no_room_in_the_context_is_a_400_and_truncates(template: ChatTemplate) -> None:
    session = ProxySession(template, ScriptedClient(template.tokenizer, [ANSWER]),
                           dataclasses.replace(CONFIG, context_length=20))
    with pytest.raises(RequestError) as info:
        await session.handle(parse_request({"messages": OPENING, "tools": [ADD]}))
    assert info.value.code == "context_length_exceeded" and session.context_exceeded
    assert session.metrics["proxy/bad_requests"] == 0


async def test_an_aborted_turn_is_a_retriable_error_and_the_retry_continues_it(template: ChatTemplate) -> None:
    client = FakePolicyClient(template.tokenizer, lambda r: "one two three four five six seven eight<|im_end|>",
                              token_delay_s=0.02)
    session = ProxySession(template, client, CONFIG)
    request = parse_request({"messages": OPENING})

    async def abort_soon() -> None:
        import asyncio

        while not client.running:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        await client.abort_all()

    import asyncio

    aborter = asyncio.ensure_future(abort_soon())
    with pytest.raises(SessionError) as info:
        await session.handle(request)
    await aborter
    assert (info.value.status, info.value.kind, info.value.retry) == (503, "aborted", True)
    partial = session.partial_turn_tokens
    assert partial > 0
    reply = await session.handle(request, retry=True)
    assert reply.content == "one two three four five six seven eight" and session.partial_turn_tokens == 0
    segments = session.sequences[0].segments_of(SegmentKind.MODEL)
    assert [s.finish_reason for s in segments] == ["abort", "stop"] and len(session.sequences) == 1
    assert reply.completion_tokens == sum(s.length for s in segments)


async def test_a_closed_session_refuses_with_410(template: ChatTemplate) -> None:
    session = ProxySession(template, ScriptedClient(template.tokenizer, [ANSWER]), CONFIG)
    session.close()
    with pytest.raises(SessionError) as info:
        await session.handle(parse_request({"messages": OPENING}))
    assert info.value.status == 410


def edit_content(sent: dict[str, Any]) -> dict[str, Any]:
    return {**sent, "content": "I will add 1 and 5."}


def edit_arguments(sent: dict[str, Any]) -> dict[str, Any]:
    return {**sent, "tool_calls": [{**c, "function": {**c["function"], "arguments": '{"a":1,"b":5}'}}
                                   for c in sent["tool_calls"]]}


def edit_reasoning(sent: dict[str, Any]) -> dict[str, Any]:
    return {**sent, "reasoning_content": "I add 1 and 5."}


@pytest.mark.parametrize(("edit", "seen"), [(edit_content, "I will add 1 and 5."), (edit_arguments, '"b": 5'),
                                            (edit_reasoning, "I add 1 and 5.")])
@pytest.mark.parametrize("by", ["call_ids", "response_id"])
async def test_an_edited_reply_that_keeps_its_ids_forks_and_the_engine_sees_the_edit(
        template: ChatTemplate, edit: Any, seen: str, by: str) -> None:
    client = ScriptedClient(template.tokenizer, [THINK_CALL, ANSWER])
    session = ProxySession(template, client, CONFIG)
    first = await session.handle(parse_request({"messages": OPENING, "tools": [ADD]}, session.memo))
    sent = edit(first.message())
    if by == "response_id":  # a client that keeps the response id and regenerates the call ids
        sent = {**sent, "id": first.response_id, "tool_calls": [{**c, "id": "mine"} for c in sent["tool_calls"]]}
    messages = [*OPENING, sent, {"role": "tool", "tool_call_id": sent["tool_calls"][0]["id"], "content": "6"}]
    await session.handle(parse_request({"messages": messages, "tools": [ADD]}, session.memo))
    episode = session.finish(StopReason.ENV_DONE)
    assert len(episode.sequences) == 2 and session.metrics["proxy/fork/harness"] == 1
    fork = episode.sequences[1]
    assert fork.fork_reason is ForkReason.HARNESS and "edited" in fork.info["forked_because"]
    # the engine was asked with the conversation as the harness sent it: the edit is in its prompt
    prompt = list(client.requests[1].input_ids)
    assert prompt == template.encode([Message.from_dict(m) for m in messages], [ADD], add_generation_prompt=True)
    assert seen in template.decode(prompt) and prompt == fork.tokens[:fork.prompt_length]
    turn = episode.sequences[0].segments_of(SegmentKind.MODEL)[0]  # the first sequence keeps what was sampled
    assert episode.sequences[0].tokens[turn.start:turn.end] == list(template.tokenize(THINK_CALL))
    assert seen not in template.decode(episode.sequences[0].tokens)


@pytest.mark.parametrize("resend", [harness_style, lambda s: {**s, "content": ""}, lambda s: {**s, "content": None}])
async def test_what_common_clients_do_to_a_reply_is_still_the_reply(template: ChatTemplate, resend: Any) -> None:
    """Compact JSON arguments, reasoning dropped, content None or "": recognised by the ids, no fork."""
    client = ScriptedClient(template.tokenizer, [THINK_CALL, ANSWER])
    session = ProxySession(template, client, CONFIG)
    first = await session.handle(parse_request({"messages": OPENING, "tools": [ADD]}, session.memo))
    sent = resend(first.message())
    await session.handle(parse_request({"messages": [*OPENING, sent, {
        "role": "tool", "tool_call_id": first.calls[0][0], "content": "3"}], "tools": [ADD]}, session.memo))
    episode = session.finish(StopReason.ENV_DONE)
    assert len(episode.sequences) == 1 and session.metrics["proxy/recognised/call_ids"] == 1
    assert episode.trajectory.metrics["proxy/forks"] == 0.0  # carried as 0, not left out


async def test_content_after_a_call_is_served_as_sglang_serves_it(template: ChatTemplate) -> None:
    """SGLang's server answers only the text before the first call; the sequence keeps the whole turn."""
    after = CALL.replace("<|im_end|>", "\nDone now.<|im_end|>")
    client = ScriptedClient(template.tokenizer, ["Let me add.\n" + after, ANSWER])
    session = ProxySession(template, client, CONFIG)
    first = await session.handle(parse_request({"messages": OPENING, "tools": [ADD]}, session.memo))
    assert first.content == "Let me add." and [c[1] for c in first.calls] == ["add"]
    assert session.sequences[0].messages[-1].content == "Let me add.\n\nDone now."  # what the model wrote
    await session.handle(parse_request({"messages": [*OPENING, first.message(), {
        "role": "tool", "tool_call_id": first.calls[0][0], "content": "3"}], "tools": [ADD]}, session.memo))
    # the echo (without the text after the call) is the reply: no harness fork (the template's own
    # re-render of a turn with text after its call forks, as in the agent loop)
    assert session.metrics["proxy/recognised/call_ids"] == 1 and session.metrics["proxy/fork/harness"] == 0
    assert "Done now." in template.decode(session.sequences[0].tokens)


@pytest.mark.parametrize("body", [{"tools": [ADD], "tool_choice": "none"}, {}])
async def test_without_a_tool_parser_a_call_is_served_as_text_and_echoes_without_a_fork(
        template: ChatTemplate, body: dict[str, Any]) -> None:
    """``tool_choice: none`` or no tools: SGLang runs no tool parser, so the call's text is the content."""
    client = ScriptedClient(template.tokenizer, [CALL, ANSWER])
    session = ProxySession(template, client, CONFIG)
    first = await session.handle(parse_request({"messages": OPENING, **body}, session.memo))
    assert first.calls == () and first.finish_reason == "stop"
    assert first.content == CALL.removesuffix("<|im_end|>")
    await session.handle(parse_request({"messages": [*OPENING, first.message(), FOLLOW_UP], **body}, session.memo))
    assert len(session.sequences) == 1 and session.metrics["proxy/recognised/content"] == 1
    assert session.metrics["tool_calls"] == 0 and not session.sequences[0].messages[2].tool_calls
