"""The proxy's HTTP server with the real ``openai`` client (streaming and not) over loopback, against an
in-process fake engine: replies, errors in OpenAI's shape, the API key, isolation between sessions."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from _proxy_support import ADD, call_then_answer

from agentrl.chat import ChatTemplate
from agentrl.proxy import ProxyConfig, ProxyServer, ProxySession
from agentrl.rollout import AgentConfig, SamplingParams
from agentrl.testing.policy import FakePolicyClient
from agentrl.trajectory import ErrorKind, StopReason

CONFIG = AgentConfig(sampling=SamplingParams(max_new_tokens=64), reward_pool=False)


async def tool_loop(client: openai.AsyncOpenAI, question: str, *, stream: bool) -> str | None:
    """A harness on the real client: call, run the tool, send the result back, until a text answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for _ in range(4):
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model="agentrl", messages=messages, tools=[ADD], stream=True, stream_options={"include_usage": True})]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
            calls = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls
                     for tc in c.choices[0].delta.tool_calls]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            message: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = [{"id": tc.id, "type": "function", "function": {
                    "name": tc.function.name, "arguments": tc.function.arguments}} for tc in calls if tc.function]
        else:
            reply = await client.chat.completions.create(model="agentrl", messages=messages, tools=[ADD])
            assert reply.usage is not None and reply.usage.total_tokens == reply.usage.prompt_tokens + \
                reply.usage.completion_tokens
            message = reply.choices[0].message.model_dump(exclude_none=True)
        if not message.get("tool_calls"):
            return str(message.get("content"))
        messages.append(message)
        for call in message["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])})
    return None


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_loop_on_the_real_openai_client(template: ChatTemplate, stream: bool) -> None:
    async with ProxyServer(ProxyConfig(api_key="secret")) as server:
        session = server.open(ProxySession(template, FakePolicyClient(template.tokenizer, call_then_answer), CONFIG))
        async with openai.AsyncOpenAI(base_url=server.base_url(session), api_key="secret") as client:
            models = await client.models.list()
            assert [m.id for m in models.data] == ["agentrl"]
            answer = await tool_loop(client, "1+2?", stream=stream)
        episode = server.close(session, StopReason.ENV_DONE)
    assert answer == "The answer is 3."
    assert len(episode.sequences) == 1 and episode.trajectory.num_model_turns == 2
    assert episode.trajectory.metrics["proxy/recognised/call_ids"] == 1
    episode.validate()


async def test_errors_come_back_in_openais_shape(template: ChatTemplate) -> None:
    async with ProxyServer(ProxyConfig(api_key="secret")) as server:
        session = server.open(ProxySession(template, FakePolicyClient(template.tokenizer, call_then_answer), CONFIG))
        url = server.base_url(session)
        async with openai.AsyncOpenAI(base_url=url, api_key="wrong", max_retries=0) as bad_key:
            with pytest.raises(openai.AuthenticationError):
                await bad_key.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        async with openai.AsyncOpenAI(base_url=url, api_key="secret", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], n=2)
            assert info.value.body is not None and info.value.body["param"] == "n"  # type: ignore[index]
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        async with openai.AsyncOpenAI(base_url=url.replace(session.id, "not-a-session"), api_key="secret",
                                      max_retries=0) as stranger:
            with pytest.raises(openai.NotFoundError) as missing:
                await stranger.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            assert session.id not in str(missing.value.body)
        episode = server.close(session, StopReason.ENV_DONE)
        async with openai.AsyncOpenAI(base_url=url, api_key="secret", max_retries=0) as late:
            with pytest.raises(openai.APIStatusError) as closed:
                await late.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert closed.value.status_code == 410
    kinds = [e.kind for e in episode.trajectory.errors]
    assert kinds == [ErrorKind.AGENT_REQUEST, ErrorKind.AGENT_LATE_CALL]
    assert "n: got 2" in episode.trajectory.errors[0].message


async def test_sessions_see_nothing_of_each_other(template: ChatTemplate) -> None:
    """64 concurrent sessions, each with its own secret in its question: each episode holds its own
    secret only, ids issued to one session are not recognised by another."""
    client = FakePolicyClient(template.tokenizer, call_then_answer, token_delay_s=0.0005)
    async with ProxyServer() as server:
        sessions = [server.open(ProxySession(template, client, CONFIG)) for _ in range(64)]
        assert len({s.id for s in sessions}) == 64 and all(len(s.id) >= 32 for s in sessions)

        async def one(i: int, session: ProxySession) -> str | None:
            async with openai.AsyncOpenAI(base_url=server.base_url(session), api_key="x") as oai:
                return await tool_loop(oai, f"secret-{i}: 1+2?", stream=i % 2 == 1)

        answers = await asyncio.gather(*(one(i, s) for i, s in enumerate(sessions)))
        episodes = [server.close(s, StopReason.ENV_DONE) for s in sessions]
    assert answers == ["The answer is 3."] * 64
    for i, episode in enumerate(episodes):
        text = template.decode(episode.trajectory.tokens)
        assert f"secret-{i}:" in text and sum(f"secret-{j}:" in text for j in range(64)) == 1
        assert len(episode.sequences) == 1
    # a reply of session 0 quoted to session 1 is just text there: not recognised, the request forks
    a, b = episodes[0].trajectory, episodes[1].trajectory
    assert {c.id for m in a.messages for c in m.tool_calls}.isdisjoint({c.id for m in b.messages for c in m.tool_calls})


@pytest.mark.parametrize("media", ["text/plain", None, "application/x-www-form-urlencoded"])
async def test_a_body_not_sent_as_json_is_refused_as_openai_refuses_it(template: ChatTemplate,
                                                                        media: str | None) -> None:
    import httpx

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    async with ProxyServer() as server:
        session = server.open(ProxySession(template, FakePolicyClient(template.tokenizer, call_then_answer), CONFIG))
        url = server.base_url(session) + "/chat/completions"
        async with httpx.AsyncClient() as http:
            headers = {"Content-Type": media} if media else {}
            refused = await http.post(url, content=body, headers=headers)
            served = await http.post(url, content=body, headers={"Content-Type": "application/json; charset=utf-8"})
        episode = server.close(session, StopReason.ENV_DONE)
    assert refused.status_code == 400 and served.status_code == 200
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "unsupported_content_type", None)
    assert "application/json" in error["message"] and repr(media or "") in error["message"]
    assert [e.kind for e in episode.trajectory.errors] == [ErrorKind.AGENT_REQUEST]
