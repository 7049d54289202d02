"""``agentrl env check``: run an environment through scripted replies and report contract violations.

No model is involved. For each dataset row the checker builds environments and drives them with
message-level replies (a reply calling every registered tool with arguments made up from its
schema, a reply with an unknown tool and a parse failure, a final answer), then reports:

- ``exception``: an exception escaping ``__init__``, ``reset``, ``step``, ``reward`` or ``close``;
- ``row``: a dataset row the environment refuses at construction (reported once per row);
- ``contract``: ``reset`` not returning system/user messages (an assistant turn in the opening is
  refused), a method that is not ``async``, a bad ``StepResult``, an episode that never ends;
- ``shared_state``: the row or a class attribute changed, or two identical episodes diverged;
- ``step_after_done``: ``step`` accepted after the episode was done (it must raise);
- ``pickle``: a fresh environment that cannot be pickled (naming the attributes at fault);
- ``leak``: processes (or Docker containers) started during the episode still alive after ``close``
  (processes that already-running ones start, e.g. a shared pool's workers preparing their next
  execution, are not the episode's);
- ``reward_range``: a reward outside the class's declared ``reward_range``, or not a number.

With ``reward=fn`` (``agentrl env check --reward module:fn``), a reward function
``(trajectory, task) -> float`` like the one ``agentrl train --reward`` takes is called on every
scripted episode's conversation, and on it cut after its first assistant reply (an episode that
ends without an answer, as a truncated one does):

- ``reward_fn``: it raised, ran past 60 s, returned ``None``, something else than a number or
  :class:`~agentrl.rewards.Reward`, or a number that is not finite; the message quotes the last
  assistant text it was given.

Warnings do not fail the check: a tool that raised on every call the checker made (with arguments
made up from its schema), a tool whose function returned ``None`` (a forgotten ``return``: the
model is shown an empty result), processes that only the check's first episode left behind while
no later one started more (``shared_processes``: a pool shared across episodes, started once per
process), and, from the command line, ``--rows`` beyond the file. Each problem is reported once
per row (with how many episodes showed it); rows are named by their file line when the caller
passes ``row_numbers``. ``verbose=True`` keeps every episode's transcript for
:meth:`CheckReport.format`.

Example::

    report = asyncio.run(check_environment(ToyArithmeticEnv, rows[:3]))
    print(report.format()); assert report.ok
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
import math
import os
import pickle
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat.types import FailureKind, Message, ToolCall, ToolCallFailure
from agentrl.environments._check_probes import (
    ReturnWatch,
    at,
    conversation_text,
    describe_process,
    is_reaper,
    message_text,
    reward_problem,
    training_problem,
)
from agentrl.environments.base import Environment, EpisodeDoneError, StepResult
from agentrl.rewards.pool import shared_pool
from agentrl.rewards.types import as_reward, score
from agentrl.trajectory import Trajectory

__all__ = ["CheckReport", "Violation", "check_environment", "conversation_text", "example_arguments",
           "training_problem"]

_FINAL_ANSWER = "The answer is \\boxed{0}."
_REWARD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Violation:
    """One broken contract: which check, on which row, and what happened.

    ``row`` is the row's index in the list checked; ``line`` its line in the data file when known.
    """

    check: str
    message: str
    row: int | None = None
    line: int | None = None

    def __str__(self) -> str:
        if self.line is not None:
            where = f"line {self.line}: "
        else:
            where = f"row {self.row}: " if self.row is not None else ""
        return f"[{self.check}] {where}{self.message}"


@dataclass
class CheckReport:
    env_name: str
    rows_checked: int = 0
    episodes: int = 0
    violations: list[Violation] = field(default_factory=list)
    warnings: list[Violation] = field(default_factory=list)
    transcripts: list[str] = field(default_factory=list)  # filled with verbose=True
    reward_name: str | None = None  # the reward function checked (reward=), if any
    reward_calls: int = 0

    @property
    def ok(self) -> bool:
        """No violation (warnings do not count)."""
        return not self.violations

    @property
    def checks_failed(self) -> set[str]:
        return {v.check for v in self.violations}

    def format(self) -> str:
        head = (f"{self.env_name}: {self.rows_checked} rows, {self.episodes} episodes, "
                f"{len(self.violations)} violation(s)")
        if self.warnings:
            head += f", {len(self.warnings)} warning(s)"
        if self.reward_name is not None:
            head += f", reward {self.reward_name} called {self.reward_calls} times"
        lines = [*self.transcripts, head + ("" if self.violations else " — OK")]
        lines += [f"  {v}" for v in self.violations]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def example_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments that satisfy a JSON schema's required properties (defaults, first enum, simple values)."""
    props = schema.get("properties", {}) or {}
    out: dict[str, Any] = {}
    for name in schema.get("required", list(props)) or []:
        spec = props.get(name, {}) or {}
        if "default" in spec:
            out[name] = spec["default"]
        elif spec.get("enum"):
            out[name] = spec["enum"][0]
        else:
            t = spec.get("type", "string")
            t = t[0] if isinstance(t, list) and t else t
            values: dict[str, Any] = {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {},
                                      "null": None}
            out[name] = values.get(t, "print(1)" if name in ("code", "source", "program") else "1")
    return out


def _descendants() -> dict[tuple[int, str], int]:
    """(pid, start time) -> parent pid of every live descendant process of this one (Linux /proc)."""
    parent: dict[int, int] = {}
    start: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z":  # a zombie is dead; its parent just has not reaped it yet
            continue
        parent[int(entry)], start[int(entry)] = int(fields[1]), fields[19]
    me, frontier = os.getpid(), [os.getpid()]
    found: dict[tuple[int, str], int] = {}
    while frontier:
        p = frontier.pop()
        for child, ppid in parent.items():
            if ppid == p and child != me and (child, start[child]) not in found:
                if p == me and is_reaper(child):  # agentrl's own reaper: this process's, not an episode's
                    continue
                found[(child, start[child])] = ppid
                frontier.append(child)
    return found


def _started_here(new: set[tuple[int, str]], parents: dict[tuple[int, str], int]) -> set[tuple[int, str]]:
    """The processes of ``new`` that this process started (directly, or through other new ones). The
    others are the work of processes that were running before (a shared pool's worker preparing its
    next execution), not the episode's."""
    new_pids, me = {pid for pid, _ in new}, os.getpid()
    by_pid = {pid: ppid for (pid, _), ppid in parents.items()}
    out = set()
    for key in new:
        pid = key[0]
        while by_pid.get(pid) in new_pids:
            pid = by_pid[pid]
        if by_pid.get(pid) == me:
            out.add(key)
    return out


def _containers() -> set[str] | None:
    if shutil.which("docker") is None:
        return None
    try:
        # -a: a created or stopped container left behind is a leak too (it holds its filesystem and name)
        out = subprocess.run(["docker", "ps", "-a", "-q", "--no-trunc"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(out.stdout.split()) if out.returncode == 0 else None


def _class_state(cls: type) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for klass in cls.__mro__:
        if klass is object or klass is Environment:
            continue
        for name, value in vars(klass).items():
            if name.startswith("__") or callable(value) or isinstance(value, classmethod | staticmethod | property):
                continue
            try:  # pickled bytes compare by value even for objects without __eq__ (tools, configs)
                state[f"{klass.__name__}.{name}"] = pickle.dumps(value)
            except Exception:
                state[f"{klass.__name__}.{name}"] = repr(value)
    return state


def _unpicklable_parts(env: Environment) -> list[str]:
    bad = []
    for name, value in vars(env).items():
        try:
            pickle.dumps(value)
        except Exception as exc:
            bad.append(f"{name} ({type(exc).__name__}: {str(exc)[:80]})")
    return bad


@dataclass
class _Episode:
    """Drives one environment through a script; collects a transcript and violations."""

    env_cls: type[Environment]
    row: Any
    row_index: int
    script: str
    reward_fn: Callable[..., Any] | None = None
    violations: list[Violation] = field(default_factory=list)
    transcript: list[tuple[str, str]] = field(default_factory=list)  # (what, text)
    reward: float | None = None  # what the environment's reward gave the episode
    tool_outcomes: list[tuple[str, dict[str, Any], str | None]] = field(default_factory=list)  # name, args, error
    leaks: list[str] = field(default_factory=list)  # what outlived close(): judged per row (_leak_findings)
    none_returns: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # calls whose function gave None
    reward_calls: int = 0

    def fail(self, check: str, message: str) -> None:
        self.violations.append(Violation(check, message, self.row_index))

    def replies(self, env: Environment) -> list[tuple[Message, list[ToolCallFailure]]]:
        answer: tuple[Message, list[ToolCallFailure]] = (Message(role="assistant", content=_FINAL_ANSWER), [])
        if self.script == "tools" and env.tool_specs():
            calls = [ToolCall(name=s["function"]["name"], id=f"call_{i}",
                              arguments=example_arguments(s["function"].get("parameters") or {}))
                     for i, s in enumerate(env.tool_specs())]
            return [(Message(role="assistant", content="Let me use the tools.", tool_calls=calls), []), answer]
        if self.script == "reference":
            return []  # env.reference_reply, turn by turn
        if self.script == "failures":
            bad = ToolCallFailure(FailureKind.MALFORMED_JSON, "expected a JSON object", raw="<tool_call>{oops")
            ghost = ToolCall(name="no_such_tool_xyz", arguments={}, id="call_ghost")
            return [(Message(role="assistant", content="Trying.", tool_calls=[ghost]), [bad]), answer]
        return [answer]

    def next_reply(self, env: Environment, script: list[tuple[Message, list[ToolCallFailure]]], turn: int,
                   messages: list[Message]) -> tuple[Message, list[ToolCallFailure]] | None:
        """The script's reply for ``turn``, or the environment's reference reply (None: it failed, reported)."""
        if script:
            return script[min(turn, len(script) - 1)]
        try:
            reply = env.reference_reply(list(messages))
        except Exception as exc:
            self.fail("exception", f"reference_reply() raised {type(exc).__name__}: {str(exc)[:200]}{at(exc)}")
            return None
        if reply is None:
            self.fail("reference", f"reference_reply() returned None on turn {turn + 1}; expected the winning reply "
                      "until the episode ends")
            return None
        return reply, []

    async def guarded(self, what: str, coro: Any) -> tuple[bool, Any]:
        if not inspect.isawaitable(coro):
            name = what.split("(")[0]
            self.fail("contract", f"{what} returned {type(coro).__name__} instead of an awaitable: define it as "
                      f"`async def {name}(self, ...)`")
            return False, None
        try:
            return True, await coro
        except Exception as exc:
            self.fail("exception", f"{what} raised {type(exc).__name__}: {str(exc)[:200]}{at(exc)}")
            return False, None

    async def run(self) -> None:
        procs0, containers0 = set(_descendants()), _containers()
        try:
            env = self.env_cls(self.row)
        except Exception as exc:
            self.fail("exception", f"{self.env_cls.__name__}(row) raised {type(exc).__name__}: {str(exc)[:200]}"
                      f"{at(exc)}")
            return
        if self.script == "tools" and _not_picklable(env):
            bad = _unpicklable_parts(env)
            self.fail("pickle", "a fresh environment cannot be pickled: " + (", ".join(bad) or "(the instance)"))
        try:
            await self.drive(env)
        finally:
            await self.guarded("close()", env.close())
        await self.check_leaks(procs0, containers0)

    async def drive(self, env: Environment) -> None:
        ok, opening = await self.guarded("reset()", env.reset())
        if not ok:
            return
        if not isinstance(opening, list) or not opening or not all(isinstance(m, Message) for m in opening):
            self.fail("contract", f"reset() must return a non-empty list of Message, got {opening!r:.120}")
            return
        roles = [m.role for m in opening]
        if any(r not in ("system", "user") for r in roles):
            self.fail("contract", f"reset() must return system and user messages only (the model writes the "
                      f"assistant turns), got roles {roles}")
            return
        messages = list(opening)
        self.transcript.append(("reset", conversation_text(opening, "")))
        if self.script == "tools":  # tools registered in reset() included; the private map is the one step() calls
            env._tools = {name: ReturnWatch(t, self.none_returns) for name, t in env.tool_map.items()}
        script = self.replies(env)
        limit = env.limits.max_turns + 2
        done = False
        last: tuple[Message, list[ToolCallFailure]] = (Message(role="assistant", content=_FINAL_ANSWER), [])
        for turn in range(limit):
            played = self.next_reply(env, script, turn, messages)
            if played is None:
                return
            reply, failures = last = played
            self.transcript.append((f"reply {turn + 1}", message_text(reply)))
            ok, res = await self.guarded(f"step() on turn {turn + 1}", env.step(reply, failures))
            if not ok:
                return
            if not isinstance(res, StepResult):
                self.fail("contract", f"step() must return a StepResult, got {type(res).__name__}")
                return
            self.check_picklable(res, f"StepResult of turn {turn + 1}")
            self.record_tool_outcomes(reply, res)
            messages.append(reply)
            messages.extend(res.messages)
            ending = f" -> done ({res.stop_reason.value if res.stop_reason else 'no reason'})" if res.done else ""
            self.transcript.append((f"step {turn + 1}", conversation_text(res.messages, "") + ending))
            if res.done:
                done = True
                break
        if not done:
            self.fail("contract", f"the episode did not end after {limit} turns (max_turns={env.limits.max_turns})")
            return
        await self.check_step_after_done(env, last)
        await self.check_reward(env, messages)
        if self.reward_fn is not None:
            await self.check_reward_fn(env, messages)

    def record_tool_outcomes(self, reply: Message, res: StepResult) -> None:
        if self.script != "tools":
            return
        answers = {m.tool_call_id: m for m in res.messages if m.role == "tool" and m.tool_call_id}
        for call in reply.tool_calls:
            answer = answers.get(call.id) if call.id is not None else None
            text = str(answer.content) if answer is not None else ""
            error = text if text.startswith(f"Error: {FailureKind.TOOL_ERROR.value}:") else None
            self.tool_outcomes.append((call.name, call.arguments, error))

    def check_picklable(self, obj: Any, what: str) -> None:
        try:
            pickle.dumps(obj)
        except Exception as exc:
            self.fail("pickle", f"{what} cannot be pickled: {type(exc).__name__}: {str(exc)[:120]}")

    async def check_step_after_done(self, env: Environment, reply: tuple[Message, list[ToolCallFailure]]) -> None:
        try:
            await env.step(*reply)
        except Exception:
            return  # refused, as it must be (EpisodeDoneError for the base class)
        self.fail("step_after_done", "step() was accepted after the episode was done; it must raise "
                  f"{EpisodeDoneError.__name__}")

    async def check_reward(self, env: Environment, messages: list[Message]) -> None:
        traj = Trajectory.from_prompt([0], messages=messages)
        try:
            reward = await score(env.reward, traj, timeout_s=60, pool=shared_pool())
        except Exception as exc:
            self.fail("reward_range" if isinstance(exc, TypeError | ValueError) else "exception",
                      f"reward() failed: {type(exc).__name__}: {str(exc)[:200]}{at(exc)}")
            return
        lo, hi = env.reward_range
        if not (lo <= as_reward(reward).value <= hi) or not math.isfinite(reward.value):
            self.fail("reward_range", f"reward {reward.value!r} lies outside the declared reward_range ({lo}, {hi})")
        self.reward = reward.value
        self.transcript.append(("reward", f"{reward.value:g}"))
        if self.script == "reference" and reward.value < hi:
            self.fail("reference", f"the reference replies scored {reward.value:g}; expected the top of reward_range "
                      f"({hi:g}): can the reward give full marks to a right answer?")

    async def check_reward_fn(self, env: Environment, messages: list[Message]) -> None:
        """Calls ``reward_fn(trajectory, task)`` on the conversation, and on it cut after the first
        assistant reply (no final answer), as ``agentrl train --reward`` would score them."""
        assert self.reward_fn is not None
        first = next(i for i, m in enumerate(messages) if m.role == "assistant")
        cases = [("the episode", messages)]
        if first + 1 < len(messages):
            cases.append(("the episode cut after its first reply", messages[:first + 1]))
        for what, conversation in cases:
            traj = Trajectory.from_prompt([0], messages=conversation)
            problem = await reward_problem(self.reward_fn, traj, env.task, timeout_s=_REWARD_TIMEOUT_S)
            self.reward_calls += 1
            if problem is not None:
                last = str(conversation[-1].content or "")
                self.fail("reward_fn", f"the reward function {problem} on {what} (last assistant text {last!r:.80})")

    async def check_leaks(self, procs0: set[tuple[int, str]], containers0: set[str] | None) -> None:
        leaked: set[tuple[int, str]] = set()
        for _ in range(20):  # give terminated processes up to ~1 s to disappear
            tree = _descendants()
            leaked = _started_here(set(tree) - procs0, tree)
            if not leaked:
                break
            await asyncio.sleep(0.05)
        if leaked:
            self.leaks.append(f"{len(leaked)} process(es) started during the episode are alive after close(): "
                              + ", ".join(describe_process(pid) for pid, _ in sorted(leaked)[:5]))
        containers1 = _containers() if containers0 is not None else None
        if containers0 is not None and containers1 is not None and containers1 - containers0:
            self.leaks.append(f"{len(containers1 - containers0)} Docker container(s) created during the episode "
                              "still exist after close()")


def _not_picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:
        return True
    return False


def _merge(episodes: Sequence[_Episode]) -> list[Violation]:
    """One violation per (check, message) over a row's episodes, naming the episodes that showed it."""
    seen: dict[tuple[str, str], list[str]] = {}
    first: dict[tuple[str, str], Violation] = {}
    for ep in episodes:
        for v in ep.violations:
            key = (v.check, v.message)
            first.setdefault(key, v)
            if ep.script not in seen.setdefault(key, []):
                seen[key].append(ep.script)
    return [Violation(v.check, f"{v.message} (in the {', '.join(seen[k])} episode{'s' if len(seen[k]) > 1 else ''})",
                      v.row) for k, v in first.items()]


def _leak_findings(runs: Sequence[_Episode], index: int, first: bool) -> tuple[list[Violation], list[Violation]]:
    """``(violations, warnings)`` for what outlived the row's episodes. When only the check's very
    first episode left processes and no later one did, they are a pool shared across episodes
    (started once per process, e.g. a warm sandbox pool): a warning naming them, not a leak."""
    leaking = [ep for ep in runs if ep.leaks]
    if first and leaking == [runs[0]]:
        return [], [Violation("shared_processes", "; ".join(runs[0].leaks) + ", and no later episode started more: "
                              "a pool shared across episodes? (its owner closes it; an episode's own processes "
                              "must not outlive close())", index)]
    # one violation per leak message over the row, naming every episode that showed it
    scripts: dict[str, list[str]] = {}
    for ep in leaking:
        for text in ep.leaks:
            if ep.script not in scripts.setdefault(text, []):
                scripts[text].append(ep.script)
    return [Violation("leak", f"{text} (in the {', '.join(names)} episode{'s' if len(names) > 1 else ''})", index)
            for text, names in scripts.items()], []


def _tool_warnings(episodes: Sequence[_Episode]) -> list[Violation]:
    calls: dict[str, list[tuple[dict[str, Any], str | None]]] = {}
    for ep in episodes:
        for name, args, error in ep.tool_outcomes:
            calls.setdefault(name, []).append((args, error))
    out = []
    for name, outcomes in calls.items():
        if all(error is not None for _, error in outcomes):
            args, error = outcomes[0]
            out.append(Violation("tool_error", f"tool {name!r} raised on every call ({len(outcomes)}), e.g. with "
                                 f"{json.dumps(args)[:120]}: {str(error)[:160]}"))
    nones: dict[str, list[dict[str, Any]]] = {}
    for ep in episodes:
        for name, args in ep.none_returns:
            nones.setdefault(name, []).append(args)
    for name, seen in nones.items():
        out.append(Violation("tool_none", f"tool {name!r} returned None on {len(seen)} of {len(calls.get(name, seen))} "
                             f"calls (e.g. with {json.dumps(seen[0], default=str)[:120]}): the model is shown an empty "
                             "result; a forgotten `return`? (return \"\" to mean empty)"))
    return out


def _transcript(ep: _Episode, label: str) -> str:
    lines = [f"--- {label}, {ep.script} episode"]
    for what, text in ep.transcript:
        head = f"    {what + ':':<9}"
        lines += [(head if i == 0 else " " * len(head)) + line for i, line in enumerate(text.splitlines() or [""])]
    return "\n".join(lines)


async def check_environment(env_cls: type[Environment], rows: Sequence[Any], *, max_rows: int = 3,
                            row_numbers: Sequence[int] | None = None, verbose: bool = False,
                            reward: Callable[..., Any] | None = None) -> CheckReport:
    """Runs the scripted episodes on up to ``max_rows`` rows and returns every violation found.

    ``row_numbers``: how to name each row in the report (e.g. its line in the data file); default:
    its index. ``verbose``: keep each episode's transcript in :attr:`CheckReport.transcripts`.
    ``reward``: a reward function ``(trajectory, task) -> float`` to check on every episode too.
    """
    if not (isinstance(env_cls, type) and issubclass(env_cls, Environment)):
        raise TypeError(f"check_environment: expected an Environment subclass, got {env_cls!r}")
    if not rows:
        raise ValueError("check_environment: rows is empty; expected at least one dataset row")
    if row_numbers is not None and len(row_numbers) < min(len(rows), max_rows):
        raise ValueError(f"check_environment: row_numbers has {len(row_numbers)} entries for {len(rows)} rows")
    report = CheckReport(env_name=f"{env_cls.__module__}:{env_cls.__qualname__}")
    if reward is not None:
        report.reward_name = f"{getattr(reward, '__module__', '?')}:{getattr(reward, '__qualname__', repr(reward))}"
    # the reward pool is a run's infrastructure, started before any episode (as a run starts it): its
    # worker processes are not the episode's
    await asyncio.to_thread(shared_pool().warm)
    every: list[_Episode] = []
    for index, row in enumerate(rows[:max_rows]):
        line = row_numbers[index] if row_numbers is not None else None
        found = await _check_row(env_cls, row, index, report, every, verbose, line, reward)
        report.violations.extend(dataclasses.replace(v, line=line) for v in found)
        report.rows_checked += 1
    report.warnings.extend(_tool_warnings(every))
    floor = _reward_floor(env_cls, every)
    if floor is not None:
        report.warnings.append(floor)
    return report


def _reward_floor(env_cls: type[Environment], episodes: Sequence[_Episode]) -> Violation | None:
    """A warning when every scripted episode scored the bottom of ``reward_range`` and the environment
    has no reference reply: the check never reached a winning answer, so a reward that can never give
    full marks would pass."""
    scored = [ep.reward for ep in episodes if ep.reward is not None]
    lo = env_cls.reward_range[0]
    if not scored or any(r != lo for r in scored) or any(ep.script == "reference" for ep in episodes):
        return None
    return Violation("reward_floor", f"every scripted episode ({len(scored)}) scored {lo:g}, the bottom of "
                     "reward_range: the check never reached a winning answer. Define reference_reply(messages) "
                     "on the environment (a scripted solver) to check that a right answer scores the top")


async def _check_row(env_cls: type[Environment], row: Any, index: int, report: CheckReport,
                     every: list[_Episode], verbose: bool, line: int | None,
                     reward: Callable[..., Any] | None = None) -> list[Violation]:
    try:
        env_cls(row)
    except Exception as exc:  # a bad row: one report, no episodes
        return [Violation("row", f"{env_cls.__name__}(row) refused the row: {type(exc).__name__}: "
                          f"{str(exc)[:300]}{at(exc)}", index)]
    row_before, class_before = copy.deepcopy(row), _class_state(env_cls)
    first = report.episodes == 0
    # with a scripted solver, its winning episode is the one that answers (the top must be reachable)
    scripts = ["tools", "tools", "failures",
               "answer" if env_cls.reference_reply is Environment.reference_reply else "reference"]
    runs = [_Episode(env_cls, row, index, s, reward) for s in scripts]
    for ep in runs:
        await ep.run()
        report.episodes += 1
        report.reward_calls += ep.reward_calls
        if verbose:
            report.transcripts.append(_transcript(ep, f"line {line}" if line is not None else f"row {index}"))
    every.extend(runs)
    found = _merge(runs)
    leaks, shared = _leak_findings(runs, index, first)
    found += leaks
    report.warnings.extend(dataclasses.replace(w, line=line) for w in shared)
    if row != row_before:
        found.append(Violation("shared_state", "the dataset row was modified by an episode", index))
    changed = [k for k, v in _class_state(env_cls).items() if class_before.get(k, v) != v]
    if changed:
        found.append(Violation("shared_state", "class attributes changed across episodes: "
                               + ", ".join(sorted(changed)), index))
    if runs[0].transcript and runs[1].transcript and runs[0].transcript != runs[1].transcript:
        found.append(Violation("shared_state", "two identical episodes produced different "
                               "transcripts (state leaks from one episode into the next)", index))
    return found
