"""``agentrl env check`` for an agent harness: run it on dataset rows against a scripted model.

No model is involved: a scripted policy answers through a real proxy server (the harness talks
HTTP to it as it will in training). Per row, its first turn calls the first tool the request lists
(arguments made up from the tool's schema, in the template's call format), later turns call a
``final_answer`` tool when one is listed and a forced call is asked for, else answer in text. The
report (:class:`~agentrl.environments.CheckReport`) lists:

- ``pickle``: the agent cannot be pickled (a training run ships it to the rollout actor);
- ``row``: a row the agent's ``task_type`` refuses;
- ``exception`` / ``timeout``: ``run`` raised or ran past its deadline (``agent`` /
  ``agent_timeout`` errors: such episodes are never trained);
- ``request``: a request the proxy refused (the 400 it answered);
- ``no_model_call``: ``run`` returned without calling the model;
- ``late_call``: a call after ``run`` returned;
- ``episode``: the built episode does not validate or ``build_training_batch`` refuses it;
- ``reward_fn``: the reward raised, ran past 60 s, or returned no finite number;

and, as warnings, history rewrites that fork the episode (``fork``: the harness truncated,
summarised or re-ordered its messages; each fork trains as its own sequence), and every episode
scoring the same (``reward_floor``: the scripted model never answers right, so whether the reward can
give full marks is untested). An error raised in the harness names where (``file:line``).
``verbose`` keeps each episode's transcript: every sequence's messages, the answer, the reward.
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from agentrl._tracebacks import exception_origin
from agentrl.chat.template import ChatTemplate
from agentrl.environments.conformance import (
    CheckReport,
    Violation,
    conversation_text,
    example_arguments,
    training_problem,
)
from agentrl.proxy.adapter import Agent, AgentRunner
from agentrl.rollout._agent_config import AgentConfig
from agentrl.rollout.types import FinishKind, FinishReason, GenerateResult, SamplingParams
from agentrl.trajectory import ErrorKind

__all__ = ["check_agent"]

_MAX_SCRIPTED_TURNS = 8
_CHECK_TIMEOUT_S = 60.0


def _call_text(call_format: str, name: str, arguments: dict[str, Any]) -> str:
    if call_format == "xml":
        params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                         for k, v in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


class _ScriptedModel:
    """Answers each request of one session by the script in the module doc."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.runner: AgentRunner | None = None
        self.turns = 0

    def _text(self) -> str:
        assert self.runner is not None
        request = self.runner.session.last_request
        tools = (request.render_tools or []) if request is not None else []
        forced = request is not None and request.forced
        by_name = {t["function"]["name"]: t["function"] for t in tools}
        pick = None
        if tools and self.turns == 0:
            pick = tools[0]["function"]
        elif forced:
            pick = by_name.get("final_answer", tools[0]["function"])
        self.turns += 1
        if pick is None or self.turns > _MAX_SCRIPTED_TURNS:
            return "The answer is \\boxed{0}." + self.template.turn_close
        args = example_arguments(pick.get("parameters") or {})
        return _call_text(self.template.tool_call_format, pick["name"], args) + self.template.turn_close

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str | None = None,
                       routing_key: str | None = None, **_: Any) -> GenerateResult:
        ids = tuple(self.template.tokenize(self._text()))[: sampling.max_new_tokens]
        kind = FinishKind.STOP if ids and ids[-1] in sampling.stop_token_ids else FinishKind.LENGTH
        return GenerateResult(rid=rid or "check", output_ids=ids, output_logprobs=tuple(-0.5 for _ in ids),
                              finish_reason=FinishReason(kind), weight_version="0", prompt_tokens=len(input_ids),
                              cached_tokens=0, completion_tokens=len(ids))


def _reward_problem(episode: Any) -> str | None:
    traj = episode.trajectory
    error = traj.error_of(ErrorKind.REWARD, ErrorKind.REWARD_TIMEOUT)
    if error is not None:
        return f"{error.message} (answer {traj.info.get('answer')!r:.120})"
    if traj.reward is None or not math.isfinite(traj.reward):
        return f"returned {traj.reward!r}; expected a finite number (answer {traj.info.get('answer')!r:.120})"
    return None


def _transcript(episode: Any, label: str) -> str:
    """Each sequence's conversation as the proxy recorded it, the answer and the reward."""
    lines = [f"--- {label}, {len(episode.sequences)} sequence(s)"]
    for i, seq in enumerate(episode.sequences):
        why = f" ({seq.info['forked_because']})" if "forked_because" in seq.info else ""
        lines.append(f"    sequence {i}{why}:")
        lines.append(conversation_text(seq.messages, "      "))
    last = episode.trajectory
    lines.append(f"    answer:  {last.info.get('answer')!r:.300}")
    lines.append(f"    reward:  {last.reward}")
    return "\n".join(lines)


async def _one(agent: Agent, row: Any, template: ChatTemplate, config: AgentConfig,
               reward: Callable[..., Any] | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]], Any]:
    """(violations, warnings) of one episode, as (check, message) pairs, and the episode (None: no episode)."""
    bad: list[tuple[str, str]] = []
    warn: list[tuple[str, str]] = []
    try:
        env = agent(row)
    except Exception as exc:
        where = exception_origin(exc)
        return [("row", f"the agent refuses the row: {type(exc).__name__}: {exc}"
                        + (f" (at {where})" if where else ""))], [], None
    if reward is not None:
        task, fn = env.task, reward
        env.reward = lambda trajectory: fn(trajectory, task)
    model = _ScriptedModel(template)
    runner = AgentRunner(env, template, model, config, group_id="check", sample_id="check:0")
    model.runner = runner
    try:
        episode = await runner.advance()
        await asyncio.sleep(0.2)  # a call the harness left running shows up as a late call
    finally:
        await runner.close()
    assert episode is not None
    errors = [e for seq in episode.sequences for e in seq.errors]
    names = {ErrorKind.AGENT: "exception", ErrorKind.AGENT_TIMEOUT: "timeout", ErrorKind.AGENT_REQUEST: "request",
             ErrorKind.AGENT_LATE_CALL: "late_call"}
    for error in errors:
        if error.kind in names:
            check = "no_model_call" if "without calling the model" in error.message else names[error.kind]
            bad.append((check, error.message + (f" (at {error.origin})" if error.origin else "")))
    if any(e.kind in (ErrorKind.AGENT, ErrorKind.AGENT_TIMEOUT) for e in errors):
        return bad, warn, episode
    problem = _reward_problem(episode)
    if problem is not None:
        bad.append(("reward_fn", problem))
    else:
        trains = training_problem(episode)
        if trains is not None:
            bad.append(("episode", trains))
    forks = int(episode.trajectory.metrics.get("proxy/fork/harness", 0))
    if forks:
        why = next((s.info.get("forked_because") for s in episode.sequences if "harness" in
                    str(s.info.get("forked_because", ""))), "")
        warn.append(("fork", f"the harness rewrote its history {forks} time(s) ({why}); each fork trains as its "
                             "own sequence"))
    return bad, warn, episode


async def check_agent(agent: Agent, rows: Sequence[Any], *, template: ChatTemplate, row_numbers: Sequence[int] | None = None,
                      reward: Callable[..., Any] | None = None, verbose: bool = False,
                      name: str | None = None) -> CheckReport:
    """Runs ``agent`` once per row against the scripted model (module doc); ``reward`` replaces its own,
    as ``agentrl train --reward`` does; ``name``: how the report names the agent (the command line's
    ``module:attr``; default the agent's own name)."""
    report = CheckReport(env_name=name or agent.__name__,
                         reward_name=getattr(reward, "__name__", None) if reward else None)
    try:
        pickle.dumps(agent)
    except Exception as exc:
        report.violations.append(Violation("pickle", f"the agent cannot be pickled ({type(exc).__name__}: {exc}); "
                                                     "a training run ships it to the rollout actor"))
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=256), reward_pool=False,
                         reward_timeout_s=_CHECK_TIMEOUT_S)
    timeout = agent.timeout_s
    agent.timeout_s = min(timeout or _CHECK_TIMEOUT_S, _CHECK_TIMEOUT_S)
    rewards: list[float | None] = []
    try:
        for i, row in enumerate(rows):
            line = row_numbers[i] if row_numbers is not None else None
            bad, warn, episode = await _one(agent, row, template, config, reward)
            report.rows_checked += 1
            report.episodes += 1
            report.reward_calls += 1 if reward is not None else 0
            report.violations += [Violation(c, m, row=i, line=line) for c, m in bad]
            report.warnings += [Violation(c, m, row=i, line=line) for c, m in warn]
            rewards.append(episode.reward if episode is not None else None)
            if verbose and episode is not None:
                report.transcripts.append(_transcript(episode, f"line {line}" if line is not None else f"row {i}"))
    finally:
        agent.timeout_s = timeout
    scored = [r for r in rewards if r is not None]
    if scored and len(set(scored)) == 1:
        report.warnings.append(Violation("reward_floor", f"every scripted episode ({len(scored)}) scored {scored[0]:g}: "
                                         "the scripted model never gives a right answer, so the check cannot tell "
                                         "whether the reward ever gives full marks; try the reward on a known right "
                                         "answer"))
    return report
