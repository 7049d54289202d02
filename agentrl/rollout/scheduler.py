"""The rollout scheduler: one training step's batch of complete prompt groups, every prompt accounted for.

:meth:`Scheduler.collect` turns prompts into exactly ``groups_per_step`` accepted groups of
``group_size`` episodes each, as fast as the engines allow:

1. **Buffer first.** Groups an earlier step cut short (``partial_rollout``) resume before any fresh
   prompt is drawn. Staleness is bounded by admission, not by discarding finished work: a group
   whose tokens would be too old for the *next* step is one this step must finish, so the batch
   waits for it (and makes room for it, moving a fresh group to the buffer); a buffered group that
   is already beyond the bound (the policy jumped several versions) is not resumed but dropped and
   counted. Long episodes are therefore not starved by short ones.
2. **Groups in flight.** Each group's G members run concurrently through the agent loop
   (:class:`~agentrl.rollout.agent.EpisodeRunner`); a group is judged when all its members end,
   groups complete independently (first done, first judged). A member that fails for an
   infrastructure reason (engine unavailable, environment or reward exception) is **regenerated
   alone**, up to ``member_retries`` times; the rest of its group is kept. A group still short of
   ``min_group_size`` finished members after that fails (counted with its reason).
3. **Dynamic sampling.** The optional filter accepts or rejects each finished group; rejections are
   counted by reason and replaced by new groups, so the batch has exactly N accepted groups.
   ``over_sampling`` keeps extra groups in flight to hide the rejection rate; a filter that rejects
   ``max_rejected_groups`` groups in one step stops the run with :class:`SchedulerError`.
4. **Abort when full.** Every request of this step still in flight is aborted on its engine, by
   request id (other clients' requests, an evaluation for instance, are left alone), until every
   episode has settled; then the engines are polled (``/v1/loads``) until idle. Episodes in their
   tool phase honour the abort before their next engine call.
5. **Leftovers.** With ``partial_rollout`` a cut-short group waits in the buffer with its work (its
   environments open, each member's partial turn kept), and surplus finished groups wait whole.
   Without it the work is discarded, environments closed, and the prompt is *recycled*: served
   again from scratch next step. :meth:`Scheduler.state_dict` saves the buffer as JSON and
   :meth:`Scheduler.load_state_dict` rebuilds it in a new process (:mod:`agentrl.rollout.restore`).
6. **Hand-over.** With ``mask_offpolicy`` tokens sampled by an older weight version than the current
   policy get loss mask 0; otherwise they are kept for TIS/MIS to correct. Every accepted group's
   staleness (``policy_version − oldest version among its trainable tokens``) is within the bound.

The :class:`~agentrl.rollout.report.StepReport` lists where every prompt went and the step's
metrics. The scheduler is a plain object driven from one event loop (no threads, no Ray); the
runner wraps it in an actor. Concurrency: ``max_requests_per_engine × engines`` generation requests
in flight, ``max_tool_concurrency`` environment steps that run tools, each bound separately; a
request that waited for a slot checks the abort flag before it is sent.

Example::

    scheduler = Scheduler(ToyArithmeticEnv, template, client, source,
                          SchedulerConfig(groups_per_step=8, group_size=8), agent=AgentConfig(...))
    batch = await scheduler.collect()
    batch.trajectories(); batch.report.check()
    scheduler.set_policy_version(1)        # after the weight update
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentrl._tracebacks import exception_origin
from agentrl.chat.template import ChatTemplate
from agentrl.data.source import DataExhausted, DataSource
from agentrl.environments.base import Environment
from agentrl.rollout._requests import new_id
from agentrl.rollout._scheduler_types import (
    RepeatedFailureError,
    RolloutProgress,
    SchedulerConfig,
    SchedulerError,
    StepBatch,
)
from agentrl.rollout._step import (
    FailureStreak,
    Member,
    MemberRecord,
    PendingGroup,
    Step,
    StepClient,
    close_all,
    lost_reason,
    member_sequences,
    oldest_version,
    segment_version,
)
from agentrl.rollout.agent import (
    PROMPT_TOO_LONG,
    AgentConfig,
    EpisodeRunner,
    GenerateClient,
    runner_for,
)
from agentrl.rollout.eval import EvalConfig, EvalReport, evaluate
from agentrl.rollout.groups import GroupFilter, RolloutGroup, apply_filter
from agentrl.rollout.opening import OpeningCache
from agentrl.rollout.pacing import Pacer
from agentrl.rollout.report import StepReport
from agentrl.rollout.restore import RestoreError, member_state, replay, restore_groups
from agentrl.trajectory import EpisodeError, ErrorKind, Status

__all__ = ["RepeatedFailureError", "RolloutProgress", "Scheduler", "SchedulerConfig", "SchedulerError", "StepBatch"]

EnvFactory = Callable[[dict[str, Any]], Environment]
LoadProbe = Callable[[], Awaitable[int]]


REWARD_FAILURES = ("reward_error", "reward_timeout")


class Scheduler:
    """Collects training steps from a data source; see the module doc.

    ``env_factory`` builds one environment from one row's data (an :class:`Environment` subclass
    works); ``client`` is the engine group's client (:meth:`InferenceClient.abort` reaches the engines
    by request id); ``load_probe`` returns the number of requests running or waiting on the engines
    (used to check that an abort left them idle; ``None``: not checked); ``engines`` sizes the request
    bound (``max_requests_per_engine × engines``).
    """

    def __init__(self, env_factory: EnvFactory, template: ChatTemplate, client: GenerateClient, data: DataSource,
                 config: SchedulerConfig | None = None, *, agent: AgentConfig | None = None,
                 group_filter: GroupFilter | None = None, load_probe: LoadProbe | None = None,
                 engines: int = 1) -> None:
        self.config = config or SchedulerConfig()
        self.env_factory, self.template, self.client, self.data = env_factory, template, client, data
        self.agent = agent or AgentConfig()
        self.group_filter = group_filter
        self.load_probe = load_probe
        data.require(self.config.groups_per_step)
        self.policy_version = 0
        self.steps = 0
        self._slots = asyncio.Semaphore(self.config.max_requests_per_engine * max(engines, 1))
        self._tool_slots = asyncio.Semaphore(self.config.max_tool_concurrency)
        self.opening_cache = OpeningCache(template)
        shared = getattr(client, "pacer", None)  # one pacer per loop: the client's, when it paces its answers
        self.pacer = shared if isinstance(shared, Pacer) else Pacer()
        self._buffer: deque[PendingGroup] = deque()
        self._closing: set[asyncio.Task[None]] = set()
        self._current: Step | None = None
        self._live: tuple[list[PendingGroup], dict[Any, PendingGroup], list[int], float] | None = None
        self._bad_rows_reported = False
        self._failing = FailureStreak(self.config.max_consecutive_failed_groups)

    # -- public ------------------------------------------------------------------------------
    def set_policy_version(self, version: int) -> None:
        """The trainer's current weight version (after each weight update); never goes back."""
        if version < self.policy_version:
            raise ValueError(f"set_policy_version({version}): the policy is already at version {self.policy_version}")
        self.policy_version = version

    @property
    def buffered_groups(self) -> int:
        return len(self._buffer)

    @property
    def inflight_requests(self) -> int:
        """Generation requests of the current step on the engines right now."""
        return len(self._current.inflight) if self._current is not None else 0

    def progress(self) -> RolloutProgress | None:
        """The step being collected now (``None`` between steps): groups accepted of the target, groups
        and generation requests running, groups the filter rejected, seconds since the step began."""
        if self._live is None or self._current is None:
            return None
        accepted, running, rejected, started = self._live
        return RolloutProgress(step=self._current.index, accepted_groups=len(accepted),
                               target_groups=self.config.groups_per_step, running_groups=len(running),
                               rejected_groups=rejected[0], inflight_requests=len(self._current.inflight),
                               elapsed_s=time.monotonic() - started)

    def buffered_prompt_ids(self) -> list[str]:
        return [g.row.prompt_id for g in self._buffer]

    async def collect(self) -> StepBatch:
        """Collects one step: exactly ``groups_per_step`` accepted groups (fewer only when the data ran out)."""
        step = Step(index=self.steps)
        self._current = step
        self.steps += 1
        report = StepReport(step=step.index, policy_version=self.policy_version)
        if not self._bad_rows_reported:
            report.bad_rows, self._bad_rows_reported = len(self.data.bad_rows), True
        step.stats.start()
        accepted: list[PendingGroup] = []
        running: dict[asyncio.Task[None], PendingGroup] = {}
        try:
            await self._fill(step, report, accepted, running)
        except BaseException:
            self._live = None
            await self._abort(step, running)
            await self._discard(list(running.values()))
            raise
        await self._abort(step, running)
        self._keep_leftovers(list(running.values()), report)
        groups = self._hand_over(accepted, report)
        self._live = None
        step.stats.finish(report, groups)
        report.check()
        return StepBatch(groups=groups, report=report)

    async def evaluate(self, rows: Sequence[dict[str, Any]], config: EvalConfig | None = None) -> EvalReport:
        """Eval rollouts of ``rows`` with their own settings (:func:`~agentrl.rollout.eval.evaluate`); no
        training side effects, never aborted by a step, may run while :meth:`collect` does."""
        return await evaluate(self.env_factory, self.template, self.client, rows, config, agent=self.agent,
                              opening_cache=self.opening_cache, tool_slots=self._tool_slots)

    async def shutdown(self) -> None:
        """Ends every buffered episode and closes its environment (no sandbox or process is left)."""
        buffered, self._buffer = list(self._buffer), deque()
        await self._discard(buffered)

    def state_dict(self) -> dict[str, Any]:
        """The data cursor, the policy version and the buffered groups (rows and trajectories so far), as
        JSON types; :meth:`load_state_dict` reads it back (see :mod:`agentrl.rollout.restore`)."""
        return {
            "data": self.data.state_dict(), "policy_version": self.policy_version, "steps": self.steps,
            "buffer": [{"group_id": g.group_id, "prompt_id": g.row.prompt_id, "row_number": g.row.row_number,
                        "epoch": g.row.epoch, "row": g.row.data, "regenerated": g.regenerated,
                        "members": [member_state(m) for m in g.members]} for g in self._buffer],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the data cursor, policy version, step count and buffer. Finished
        members get their episodes back; a suspended one is rebuilt when its group next runs (a fresh
        environment, its environment side replayed and checked, its partial turn continued). Raises
        :class:`~agentrl.rollout.restore.RestoreError` (or the data source's ``DataError``) for a state
        saved for other data or another group size; nothing changes then."""
        if self._buffer:
            raise SchedulerError(f"load_state_dict: this scheduler already holds {len(self._buffer)} buffered "
                                 "groups; load into a new scheduler (or call shutdown() first)")
        missing = [k for k in ("data", "policy_version", "steps", "buffer") if k not in state]
        if missing:
            raise RestoreError(f"scheduler state: missing {missing}; expected a Scheduler.state_dict()")
        groups = restore_groups(state["buffer"], self.data, self.config.group_size)
        self.data.load_state_dict(state["data"])
        self.policy_version, self.steps = int(state["policy_version"]), int(state["steps"])
        self._bad_rows_reported = self.steps > 0  # the run's first step reported them
        self._buffer = deque(groups)

    # -- filling a step ------------------------------------------------------------------------
    async def _fill(self, step: Step, report: StepReport, accepted: list[PendingGroup],
                    running: dict[asyncio.Task[None], PendingGroup]) -> None:
        cfg = self.config
        rejected = 0
        counter = [0]
        self._live = (accepted, running, counter, time.monotonic())
        while len(accepted) < cfg.groups_per_step or any(self._must_finish(g) for g in running.values()):
            if len(accepted) < cfg.groups_per_step:
                self._top_up(step, report, accepted, running)
            if not running:
                if len(accepted) < cfg.groups_per_step:
                    report.data_exhausted = True
                return
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            # groups that finished in the same pass are judged in data order, not in the set's
            # (address-dependent) order: the same events give the same batch, run after run
            for task in sorted(done, key=lambda t: (running[t].row.epoch, running[t].row.row_number)):
                group = running.pop(task)
                task.result()  # a bug in the scheduler itself propagates
                verdict = await self._judge(group, report)
                if verdict != "stale":
                    self._failing.add(group)  # raises RepeatedFailureError at the limit
                if verdict == "accepted":
                    self._accept(group, accepted, report)
                elif verdict == "rejected":
                    rejected += 1
                    counter[0] = rejected
                    if rejected >= cfg.rejection_budget:
                        raise SchedulerError(
                            f"the group filter rejected {rejected} groups in step {step.index} "
                            f"(max_rejected_groups={cfg.rejection_budget}) with {len(accepted)} of "
                            f"{cfg.groups_per_step} accepted; reasons: {report.filtered}")

    def _accept(self, group: PendingGroup, accepted: list[PendingGroup], report: StepReport) -> None:
        """Adds a finished group; a full batch makes room for a group that cannot wait another step."""
        if len(accepted) < self.config.groups_per_step:
            accepted.append(group)
            return
        if self._must_finish(group):
            for i in range(len(accepted) - 1, -1, -1):
                if not self._must_finish(accepted[i]):
                    evicted = accepted.pop(i)
                    accepted.append(group)
                    self._keep_leftovers([evicted], report)
                    return
        self._keep_leftovers([group], report)  # finished after the batch was full: surplus

    def _must_finish(self, group: PendingGroup) -> bool:
        """Whether the group would exceed ``max_staleness`` if it waited for the next step (its tokens are
        as old as the bound allows): the step then waits for it rather than leaving it to go stale."""
        bound = self.config.max_staleness
        if bound is None or self.config.mask_offpolicy or not self.config.partial_rollout:
            return False
        oldest = min((oldest_version(member_sequences(m), m.start_version) for m in group.members),
                     default=self.policy_version)
        return self.policy_version + 1 - oldest > bound

    def _target_inflight(self, missing: int) -> int:
        cfg = self.config
        target = math.ceil(missing * (1.0 + cfg.over_sampling))
        if cfg.max_inflight_groups is not None:
            target = min(target, cfg.max_inflight_groups)
        return max(target, 1 if missing > 0 else 0)

    def _top_up(self, step: Step, report: StepReport, accepted: list[PendingGroup],
                running: dict[asyncio.Task[None], PendingGroup]) -> None:
        target = self._target_inflight(self.config.groups_per_step - len(accepted))
        while len(running) < target:
            group = self._next_group(report)
            if group is None:
                return
            if group.complete:  # a surplus group of an earlier step, finished: judged at once
                task = asyncio.ensure_future(asyncio.sleep(0))
            else:
                task = asyncio.ensure_future(self._run_group(group, step))
            running[task] = group

    def _next_group(self, report: StepReport) -> PendingGroup | None:
        while self._buffer:
            group = self._buffer.popleft()
            report.from_buffer += 1
            if self._group_too_stale(group):
                report.count("stale")
                self._close_later(group)
                continue
            return group
        try:
            (row,) = self.data.draw(1)
        except DataExhausted:
            return None
        report.drawn += 1
        return PendingGroup(group_id=new_id(), row=row,
                      members=[Member(start_version=self.policy_version) for _ in range(self.config.group_size)])

    # -- one group -----------------------------------------------------------------------------
    async def _run_group(self, group: PendingGroup, step: Step) -> None:
        await asyncio.gather(*(self._run_member(group, i, m, step) for i, m in enumerate(group.members)
                               if not m.finished))

    def _new_runner(self, group: PendingGroup, index: int, step: Step, record: MemberRecord | None) -> EpisodeRunner:
        env = self.env_factory(dict(group.row.data))
        rollout_id = record.rollout_id if record is not None else None  # a restored episode keeps its id
        return runner_for(env, self.template, StepClient(self.client, self._slots, step), self.agent,
                          group_id=group.group_id, rollout_id=rollout_id or new_id(),
                          sample_id=f"{group.row.prompt_id}:{index}", tool_slots=self._tool_slots,
                          opening_cache=self.opening_cache, pacer=self.pacer)

    async def _run_member(self, group: PendingGroup, index: int, member: Member, step: Step) -> None:
        member.stale = False
        while True:
            if member.runner is None:
                await self.pacer.turn()  # building an environment is CPU work: take turns
                record, member.restore = member.restore, None  # a suspended episode of a saved state
                if record is None:
                    member.start_version = self.policy_version
                try:
                    member.runner = self._new_runner(group, index, step, record)
                except Exception as exc:  # the factory rejected a row it was validated against
                    member.lost = f"env_build_error: {type(exc).__name__}: {exc}"
                    member.error = EpisodeError(ErrorKind.ENV, f"{type(exc).__name__}: {exc}", turn=0,
                                                component="environment", origin=exception_origin(exc))
                    return
                if record is not None and not await self._rebuild(member, record, step):
                    continue  # the replay did not match: restarted from scratch
            else:
                member.runner.client = StepClient(self.client, self._slots, step)
            runner = member.runner

            def should_abort(m: Member = member) -> bool:
                if step.aborted:
                    return True
                if self._member_too_stale(m):
                    m.stale = True
                    return True
                return False

            try:
                episode = await runner.advance(should_abort)
            except Exception as exc:  # reset() or the opening render raised: a lost member, not a crash
                await runner.close()
                member.runner = None
                if member.retries < self.config.member_retries and not step.aborted:
                    member.retries += 1
                    group.regenerated += 1
                    continue
                member.lost = f"env_error: {type(exc).__name__}: {exc}"
                member.error = EpisodeError(ErrorKind.ENV, f"{type(exc).__name__}: {exc}", turn=0, component="reset",
                                            origin=exception_origin(exc))
                return
            if episode is None:
                if step.aborted or member.stale:  # suspended by this step's abort or the staleness bound
                    step.stats.suspended += 1
                    return
                # the engine aborted the turn on its own (a restart, another client's abort_all): resume it
                if member.retries < self.config.member_retries:
                    member.retries += 1
                    group.regenerated += 1
                    continue
                episode = runner.finish_aborted()
                if not episode.trajectory.errors:
                    episode.trajectory.add_error(ErrorKind.ENGINE, f"aborted by the engine: {runner.abort_message}",
                                                 component="scheduler")
            lost = lost_reason(episode)
            step.stats.add_episode(episode, lost)
            await runner.close()
            too_long = episode.trajectory.error_of(ErrorKind.PROMPT_TOO_LONG) if episode.status is Status.FAILED else None
            if too_long is not None:  # the opening prompt itself: another attempt would fail the same way
                member.episode, member.lost = episode, f"prompt_too_long: {too_long.message.removeprefix(PROMPT_TOO_LONG)}"
                return
            reward_failure = lost is not None and lost.startswith(REWARD_FAILURES)  # never resampled
            if lost is not None and not reward_failure and member.retries < self.config.member_retries \
                    and not step.aborted:
                member.runner = None
                member.retries += 1
                group.regenerated += 1
                continue
            member.episode, member.lost = episode, lost
            return

    async def _rebuild(self, member: Member, record: MemberRecord, step: Step) -> bool:
        """Replays a restored episode's environment side in the member's new runner; False (runner closed and
        dropped) on a mismatch. Cancelled part way (past the abort deadline), the member keeps its record."""
        runner = member.runner
        assert runner is not None
        try:
            problem = await replay(runner, record)
        except BaseException:
            member.runner, member.restore = None, record  # rebuilt again at the group's next run
            task = asyncio.ensure_future(runner.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            raise
        if problem is None:
            step.stats.restored += 1
            return True
        step.stats.restore_problems.append(problem)
        member.runner = None
        await runner.close()
        return False

    def _member_too_stale(self, member: Member) -> bool:
        bound = self.config.max_staleness
        if bound is None or self.config.mask_offpolicy or member.runner is None:
            return False
        oldest = oldest_version(member.runner.sequences, member.start_version)
        return self.policy_version - oldest > bound

    def _group_too_stale(self, group: PendingGroup) -> bool:
        bound = self.config.max_staleness
        if bound is None or self.config.mask_offpolicy:
            return False
        oldest = min((oldest_version(member_sequences(m), m.start_version) for m in group.members),
                     default=self.policy_version)
        return self.policy_version - oldest > bound

    async def _judge(self, group: PendingGroup, report: StepReport) -> str:
        """Decides a finished group: ``accepted``, ``rejected`` (filter), ``failed`` or ``stale``."""
        if any(m.stale for m in group.members):
            report.count("stale")
            await self._discard([group])
            return "stale"
        kept = [m for m in group.members if m.episode is not None and m.lost is None]
        report.members_regenerated += group.regenerated
        report.members_lost += len(group.members) - len(kept)
        dropped = next((m.lost for m in group.members if m.lost and m.lost.startswith(REWARD_FAILURES)), None)
        if dropped is not None:  # the drop_group policy: a group with a failed reward is not trained
            report.count("failed", dropped.split(":")[0])
            return "failed"
        if len(kept) < self.config.min_group_size:
            reasons = Counter((m.lost or "unfinished").split(":")[0] for m in group.members if m not in kept)
            reason = reasons.most_common(1)[0][0] if reasons else "too_few_members"
            report.count("failed", reason)
            example = next((m.lost for m in group.members if m.lost and m.lost.startswith(f"{reason}: ")), None)
            if example is not None:
                detail = example.removeprefix(f"{reason}: ")
                report.failure_examples.setdefault(reason, f"prompt {group.row.prompt_id}: {detail}")
            return "failed"
        rollout = self._as_rollout_group(group, kept)
        verdict = apply_filter(self.group_filter, rollout)
        if not verdict.keep:
            report.count("filtered", verdict.reason)
            return "rejected"
        group.members = kept
        return "accepted"

    def _as_rollout_group(self, group: PendingGroup, members: list[Member]) -> RolloutGroup:
        episodes = [m.episode for m in members if m.episode is not None]
        return RolloutGroup(group_id=group.group_id, prompt_id=group.row.prompt_id, row=group.row.data,
                            episodes=episodes, epoch=group.row.epoch, lost=len(group.members) - len(members),
                            regenerated=group.regenerated)

    # -- the end of a step ----------------------------------------------------------------------
    async def _abort(self, step: Step, running: dict[asyncio.Task[None], PendingGroup]) -> None:
        """Aborts this step's requests until every group task settled, then waits for idle engines."""
        step.aborted = True
        started = time.perf_counter()
        deadline = started + self.config.abort_timeout_s
        pending = {t for t in running if not t.done()}
        client = StepClient(self.client, self._slots, step)
        rounds = 0
        while pending and time.perf_counter() < deadline:
            rids = list(step.inflight)
            if rids:
                rounds += 1
                await asyncio.gather(*(client.abort(r) for r in rids), return_exceptions=True)
            _, pending = await asyncio.wait(pending, timeout=0.2)
        for task in pending:  # past the deadline: cancelling aborts each task's own request
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
            step.stats.abort_cancelled += len(pending)
        step.stats.abort_rounds = rounds
        step.stats.abort_settle_s = time.perf_counter() - started
        if self.load_probe is not None:
            step.stats.engine_requests_after_abort = await self._wait_idle(deadline + self.config.abort_timeout_s)
            step.stats.abort_idle_s = time.perf_counter() - started

    async def _wait_idle(self, deadline: float) -> int:
        assert self.load_probe is not None
        while True:
            try:
                left = await self.load_probe()
            except Exception:
                return -1
            if left == 0 or time.perf_counter() >= deadline:
                return left
            await asyncio.sleep(0.05)

    def _keep_leftovers(self, groups: list[PendingGroup], report: StepReport) -> None:
        for group in groups:
            if self.config.partial_rollout:
                self._buffer.append(group)
                report.count("buffered")
            else:
                self._close_later(group)
                fresh = PendingGroup(group_id=new_id(), row=group.row,
                               members=[Member() for _ in range(self.config.group_size)])
                self._buffer.append(fresh)
                report.count("recycled")

    def _close_later(self, group: PendingGroup) -> None:
        runners = group.runners()
        for m in group.members:
            m.runner = None
        for runner in runners:
            runner.finish_aborted()
        if runners:
            task = asyncio.ensure_future(close_all(runners))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _discard(self, groups: list[PendingGroup]) -> None:
        runners = [r for g in groups for r in g.runners()]
        for g in groups:
            for m in g.members:
                m.runner = None
        for runner in runners:
            runner.finish_aborted()
        await close_all(runners)
        if self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    def _hand_over(self, accepted: list[PendingGroup], report: StepReport) -> list[RolloutGroup]:
        current = self.policy_version
        out: list[RolloutGroup] = []
        for group in accepted:
            rollout = self._as_rollout_group(group, group.members)
            rollout.lost = self.config.group_size - len(group.members)
            if self.config.mask_offpolicy:
                for traj in rollout.trajectories():
                    report.masked_offpolicy_tokens += traj.mask_model_segments(
                        lambda seg: segment_version(seg.weight_version, current) < current)
            versions = rollout.weight_versions()
            staleness = current - min(versions) if versions else 0
            if self.config.max_staleness is not None and staleness > self.config.max_staleness:
                report.count("stale")
                continue
            report.staleness[staleness] = report.staleness.get(staleness, 0) + 1
            report.count("trained")
            out.append(rollout)
        return out
