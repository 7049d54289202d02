"""Bring your own agent: two harnesses written against the OpenAI client, trained by agentrl.

- ``openai_agent``: a tool loop on the real ``openai.AsyncOpenAI`` client (Chat Completions, tools);
- ``smol_agent``: a `smolagents <https://pypi.org/project/smolagents/>`_ ``ToolCallingAgent`` (its
  ``OpenAIModel`` pointed at the session's base URL; smolagents is synchronous, so its ``run`` is a
  plain function that agentrl runs in a worker thread).

Both solve ``{"question": "What is 3 * 4?", "answer": "12"}`` rows (``examples/data/arithmetic.jsonl``)
with a ``multiply`` tool and are scored by :func:`reward`. Train either by name::

    agentrl env check examples.byo_agent:openai_agent --data examples/data/arithmetic.jsonl
    agentrl train examples/byo_agent_tiny.toml                                  # smol_agent, 2 steps
    agentrl train examples/byo_agent_tiny.toml environment.name=examples.byo_agent:openai_agent

``python examples/byo_agent.py`` plays one episode of each against a scripted model (no engine) and
prints what the proxy recorded: sequences, forks, tokens, reward.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import openai
from pydantic import BaseModel

from agentrl.proxy import Agent, ProxyConfig


class Question(BaseModel):
    """One dataset row: the question and its answer (rows are checked against it before a run starts)."""

    question: str
    answer: str

MULTIPLY_TOOL = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def multiply(a: int, b: int) -> int:
    return a * b


def reward(task: Question, answer: Any) -> float:
    """1.0 when the last number in the answer is the task's answer."""
    numbers = re.findall(r"-?\d+", str(answer or ""))
    return float(bool(numbers) and numbers[-1] == task.answer)


# -- 1. the plain OpenAI client -------------------------------------------------------------------
async def openai_run(task: Question, client: openai.AsyncOpenAI, max_turns: int = 4) -> str | None:
    """Ask, run the calls the model makes, send their results back, until it answers in text."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the multiply tool, then give the result."},
        {"role": "user", "content": task.question}]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="agentrl", messages=messages, tools=[MULTIPLY_TOOL],
                                                     max_tokens=64)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))  # sent back as the client returned it
        for call in message.tool_calls:
            try:
                result = str(multiply(**json.loads(call.function.arguments)))
            except (TypeError, ValueError) as exc:  # the model's mistake: shown to it, not raised
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


openai_agent = Agent(openai_run, reward, task_type=Question, max_concurrency=16, timeout_s=120)


# -- 2. smolagents ----------------------------------------------------------------------------------
def smolagents_run(task: Question, client: openai.OpenAI, max_steps: int = 3) -> Any:
    """A smolagents ToolCallingAgent whose model is the session's OpenAI-compatible endpoint."""
    from smolagents import OpenAIModel, ToolCallingAgent, tool
    from smolagents.monitoring import LogLevel

    @tool
    def multiply_numbers(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        return multiply(a, b)

    model = OpenAIModel(model_id="agentrl", api_base=str(client.base_url), api_key=client.api_key,
                        max_tokens=64)
    agent = ToolCallingAgent(tools=[multiply_numbers], model=model, max_steps=max_steps, verbosity_level=LogLevel.OFF)
    return agent.run(task.question)


# ToolCallingAgent asks for tool_choice="required": served with a grammar (the engine's xgrammar)
smol_agent = Agent(smolagents_run, reward, task_type=Question, max_concurrency=8, timeout_s=300,
                   proxy=ProxyConfig(constrained_decoding=True, api_key="byo-agent-example"))


# -- playing one episode without an engine ---------------------------------------------------------
async def _demo() -> None:
    from agentrl.chat import ChatTemplate
    from agentrl.proxy import AgentRunner
    from agentrl.rollout import AgentConfig, SamplingParams
    from agentrl.testing import build_tokenizer
    from agentrl.testing.policy import FakePolicyClient

    def policy(request: Any) -> str:
        if "<tool_response>" in request.text or "Observation:" in request.text:
            final = '{"name": "final_answer", "arguments": {"answer": "12"}}'
            return f"<tool_call>\n{final}\n</tool_call><|im_end|>" if "final_answer" in request.text else "12<|im_end|>"
        name = "multiply_numbers" if "multiply_numbers" in request.text else "multiply"
        return f'<tool_call>\n{{"name": "{name}", "arguments": {{"a": 3, "b": 4}}}}\n</tool_call><|im_end|>'

    template = ChatTemplate.from_name("qwen3", build_tokenizer())
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=64), reward_pool=False)
    for agent in (openai_agent, smol_agent):
        runner = AgentRunner(agent({"question": "What is 3 * 4?", "answer": "12"}), template,
                             FakePolicyClient(template.tokenizer, policy), config)
        try:
            episode = await runner.advance()
        finally:
            await runner.close()
        assert episode is not None
        last = episode.trajectory
        print(f"{agent.__name__}: {episode.status.value}, reward {episode.reward}, {len(episode.sequences)} "
              f"sequence(s), {last.metrics.get('proxy/forks', 0):.0f} fork(s), "
              f"{episode.num_trainable_tokens} trainable tokens, answer {last.info.get('answer')!r}")


if __name__ == "__main__":
    asyncio.run(_demo())
