"""The training loop: :class:`Runner`, a sequence of named steps in one of three modes.

Each step of training is made of named parts, each a method, so a mode is a short arrangement of
them and a test (or a subclass) can drive or replace one part:

``collect_rollouts`` → (``score_teacher``) → ``compute_advantages`` → ``train_step`` → ``sync_weights`` →
``evaluate`` → ``checkpoint`` (and ``record``: ledger, ``metrics.jsonl``, trajectories).

Modes (``RunConfig.mode``):

- ``sync``: collect, train, sync; the engines are idle during the sync (the scheduler aborted and
  drained the step's leftovers before handing the batch over).
- ``one_step_off``: the next step's rollouts are generated while the current step trains; before
  the weight update the runner waits for that generation to finish, so no update lands while a
  request is being generated, and data trained at step k came from the weights of step k−1.
- ``bounded_staleness``: rollouts run continuously (a collector task hands batches over a queue of
  one, and starts the next batch once the queued one is taken); the weight update pauses the
  engines, loads and resumes them without aborting requests,
  and the scheduler's admission keeps every trained token within ``max_staleness`` versions
  (the scheduler is given ``max_staleness − 1``: a batch can wait one version in the queue). The
  runner checks the bound again on every batch it trains and stops with an error if it is broken.

Every step: the prompt ledger records which (epoch, prompt) were trained, a line goes to
``metrics.jsonl`` and the step's episodes to ``trajectories/``. A checkpoint holds the trainer,
the scheduler's cursor and buffer, the ledger, the step, the policy version and any batch that was
collected but not trained yet (the async modes), so a resumed run neither skips nor repeats a
prompt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.rollout.groups import RolloutGroup
from agentrl.rollout.scheduler import RepeatedFailureError, StepBatch
from agentrl.rollout.teacher import score_episodes
from agentrl.runner._interfaces import RolloutSide, RunCallback, RunSummary, TrainSide, overriding
from agentrl.runner._loop_settings import LoopSettings, NoTrainableGroupsError, RunnerError, StalenessError
from agentrl.runner._metrics import failures_text, step_metrics
from agentrl.runner.checkpoint import RunCheckpointer
from agentrl.runner.ledger import PromptLedger
from agentrl.runner.probe import ProbeError, check_adapter, compare_probe
from agentrl.runner.rundir import RunDirectory
from agentrl.runner.serialize import batch_from_state, batch_to_state
from agentrl.train.batching import NoTrainableTrajectoriesError, TrainingBatch, build_training_batch
from agentrl.trajectory import ErrorKind

__all__ = ["LoopSettings", "NoTrainableGroupsError", "RolloutSide", "RunCallback", "RunSummary", "Runner", "RunnerError",
           "StalenessError", "TrainSide", "failures_text"]


class Runner:
    """Drives one run: ``await runner.run()``. See the module doc.

    ``rollout``/``trainer`` are the two sides (in-process objects or Ray proxies, same methods);
    ``run_dir`` gets the config, metrics, trajectories and summary; ``checkpointer`` the
    checkpoints (``None``: none are written). ``resume``: a checkpoint folder to continue from.
    """

    def __init__(self, rollout: RolloutSide, trainer: TrainSide | None, settings: LoopSettings, *,
                 run_dir: RunDirectory, checkpointer: RunCheckpointer | None = None,
                 callbacks: Sequence[RunCallback] = (), resume: str | None = None,
                 warmup: dict[str, Any] | None = None) -> None:
        if trainer is None and not settings.rollout_only:
            raise ValueError("trainer: None is only allowed with rollout_only=True")
        self.rollout, self.trainer, self.settings = rollout, trainer, settings
        self.run_dir, self.checkpointer, self.callbacks = run_dir, checkpointer, list(callbacks)
        self.resume = resume
        self.ledger = PromptLedger()
        self.step = 0            # training steps done
        self.version = 0         # the trainer's weight version (engines hold it after each sync)
        self.pending: list[StepBatch] = []   # collected, not yet trained (async modes)
        self.summary = RunSummary(warmup=dict(warmup or {}))
        self._collector: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[StepBatch | BaseException] | None = None
        self._hold = asyncio.Event()
        self._idle = asyncio.Event()
        self._stop_collecting = False
        self._data_done = False
        self._checkpointed = -1
        self._syncs = 0  # weight syncs so far: an eval set measured at this step and sync is not rerun at the end
        self._measured: dict[str, tuple[int, int]] = {}
        self._started = time.perf_counter()
        self._wall_before = 0.0  # a resumed run: the wall time of the run before its checkpoint

    # ==== the named steps ===========================================================================
    async def collect_rollouts(self) -> StepBatch:
        """One step's accepted groups from the scheduler, in a canonical order (epoch, then prompt):
        groups complete in whatever order the engines finish them, and the batch (so the float sums
        of the step) must not depend on that for a resumed run to equal an uninterrupted one."""
        step = self.step + 1
        self._phase("collect_rollouts", step)
        watchers = overriding(self.callbacks, "on_rollout_progress")
        if not watchers:
            batch = await self.rollout.collect()
        else:
            batch = await self._collect_watched(step, watchers)
        batch.groups.sort(key=_group_order)
        return batch

    async def _collect_watched(self, step: int, watchers: Sequence[RunCallback]) -> StepBatch:
        """``rollout.collect()``, asking the rollout side where it stands every ``progress_interval_s``."""
        collecting = asyncio.ensure_future(self.rollout.collect())
        try:
            while True:
                done, _ = await asyncio.wait({collecting}, timeout=self.settings.progress_interval_s)
                if done:
                    return collecting.result()
                progress = await self.rollout.progress()
                if progress is not None:
                    for cb in watchers:
                        cb.on_rollout_progress(step, progress)
        finally:
            if not collecting.done():
                collecting.cancel()
                await asyncio.gather(collecting, return_exceptions=True)

    async def score_teacher(self, batch: StepBatch) -> dict[str, float]:
        """A trainer-held distillation teacher's logprob of every sampled token, on the trajectories' channel
        (``teacher.kind = "model"``; the rollout side scored the other kinds: their figures are in the report)."""
        if not self.settings.teacher_on_trainer or self.trainer is None:
            return {k: v for k, v in batch.report.metrics.items() if k.startswith("teacher/")}
        self._phase("score_teacher")
        trainer = self.trainer
        return await score_episodes(batch.episodes(), lambda sequences, _: trainer.score_teacher(sequences))

    def compute_advantages(self, batch: StepBatch) -> TrainingBatch | None:
        """The training batch (advantages by the configured estimator); ``None`` if nothing to train."""
        episodes = batch.episodes()
        try:
            return build_training_batch(episodes, self.settings.batching) if episodes else None
        except NoTrainableTrajectoriesError:
            return None

    async def train_step(self, batch: TrainingBatch | None) -> dict[str, float]:
        """One optimiser step (every rank); the weight version moves on even for a skipped batch.

        Colocated on an accelerator, the engines release their memory first and the trainer takes its
        optimizer state back; after the step the trainer offloads it again (the engines take their
        memory back in :meth:`sync_weights`)."""
        assert self.trainer is not None
        self._phase("train_step", self.step + 1)
        if batch is None:
            return {"train/skipped": 1.0}
        if not self.settings.release_engine_memory:
            return await self.trainer.train(batch, self.step)
        await self.rollout.release_memory()
        await self.trainer.onload()
        try:
            return await self.trainer.train(batch, self.step)
        finally:
            await self.trainer.offload()

    async def sync_weights(self) -> dict[str, float]:
        """Exports the trainer's weights as version ``self.version`` and has every engine load them;
        then the post-sync probe compares engine and trainer logprobs on fixed sequences.

        Colocated on an accelerator, the engines take back their weights' memory before the load and
        their KV cache and graphs after it (released weights hold nothing until the load)."""
        assert self.trainer is not None
        self._phase("sync_weights")
        self._syncs += 1
        started = time.perf_counter()
        if self.settings.release_engine_memory:
            await self.rollout.resume_memory(["weights"])
        if self.settings.sync_method == "disk":
            await self.trainer.export(await self.rollout.weights_folder(self.version))
        export_s = time.perf_counter() - started  # the other methods: the trainer sends during the load
        metrics = dict(await self.rollout.sync_weights(self.version))
        if self.settings.release_engine_memory:
            await self.rollout.resume_memory(None)
        metrics["sync/export_s"] = export_s
        metrics.update(await self.probe())
        return metrics

    async def probe(self) -> dict[str, float]:
        """Scores the probe sequences on an engine and on the trainer; raises :class:`RunnerError`
        when the mean ``|Δ|`` exceeds the bound (a stale or skipped weight sync)."""
        seqs = [list(s) for s in self.settings.probe_sequences]
        if not seqs or self.trainer is None:
            return {}
        engine, trainer = await asyncio.gather(self.rollout.score(seqs), self.trainer.score(seqs))
        try:
            return compare_probe(engine, trainer, bound=self.settings.probe_bound, version=self.version)
        except ProbeError as err:
            raise RunnerError(str(err)) from None

    async def _check_adapter(self, trainer: TrainSide) -> None:
        """LoRA: the engines apply an adapter as the trainer does (:func:`~agentrl.runner.probe.check_adapter`)."""
        folder = str(Path(await self.rollout.weights_folder(0)).parent / "probe-adapter")
        try:
            self.summary.adapter_check = await check_adapter(
                self.rollout, trainer, [list(s) for s in self.settings.probe_sequences], folder=folder,
                bound=self.settings.probe_bound, seed=self.settings.probe_seed)
        except ProbeError as err:
            raise RunnerError(str(err)) from None

    async def evaluate(self, *, final: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in await self.rollout.evals_due(self.step, final=final):
            if final and self._measured.get(name) == (self.step, self._syncs):
                report = self.summary.evals[name]  # the last step measured these very weights on it
            else:
                self._phase("evaluate")
                report = await self.rollout.evaluate(name)
                self.summary.evals[name] = report
                self._measured[name] = (self.step, self._syncs)
            out.update({f"eval/{name}/{k}": v for k, v in report.items() if isinstance(v, int | float)})
            for k, v in report.get("pass_at_k", {}).items():
                out[f"eval/{name}/pass@{k}"] = v
        return out

    async def checkpoint(self) -> str | None:
        """Writes a checkpoint of everything a resumed run needs (see the module doc)."""
        if self.checkpointer is None or self.trainer is None:
            return None
        self._phase("checkpoint")
        state = {
            "step": self.step, "policy_version": self.version, "ledger": self.ledger.state_dict(),
            "scheduler": await self.rollout.state_dict(),
            "pending": [batch_to_state(b) for b in self.pending],
            "summary": self.summary.running_state(self._wall_before + time.perf_counter() - self._started),
        }
        trainer = self.trainer
        loop = asyncio.get_running_loop()

        def write_trainer(path: Path) -> None:
            asyncio.run_coroutine_threadsafe(trainer.save(str(path)), loop).result()

        path = await asyncio.to_thread(self.checkpointer.save, self.step, write_trainer=write_trainer, state=state)
        self._checkpointed = self.step
        return str(path)

    async def record(self, batch: StepBatch, metrics: dict[str, Any]) -> None:
        """Ledger, metrics line, trajectories of step ``self.step``."""
        entries = [(g.epoch, g.prompt_id) for g in batch.groups]
        self.ledger.record(self.step, entries)
        self.summary.prompts_trained += len(entries)
        if self.settings.save_trajectories:
            self.run_dir.write_trajectories(self.step, batch.episodes())
        self.run_dir.append_metrics(self.step, metrics)
        for cb in self.callbacks:
            result = cb.on_step_end(self.step, metrics)
            if asyncio.iscoroutine(result):  # a callback may be async (e.g. to query the engines)
                await result

    def _phase(self, phase: str, step: int | None = None) -> None:
        for cb in self.callbacks:
            cb.on_phase(phase, self.step if step is None else step)

    # ==== the run ===================================================================================
    async def start(self) -> None:
        """Restores a checkpoint when resuming (then pushes its weights to the engines); tells the data
        rows the rollout side skipped."""
        problems = await self.rollout.data_problems()
        if problems:
            self.summary.bad_rows = len(problems)
            shown = "\n  ".join(problems[:10])
            more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
            self._notice(f"{len(problems)} bad data row(s) skipped:\n  {shown}{more}")
        if self.settings.lora and self.trainer is not None and self.settings.probe_sequences:
            await self._check_adapter(self.trainer)
        if self.resume is None or self.checkpointer is None:
            if self.run_dir.read_metrics():
                raise RunnerError(f"run folder {str(self.run_dir.root)!r} already holds a run's metrics: expected "
                                  "resume=<that folder> (checkpoint.resume) to continue it, or another logging.run_dir")
            if (self.settings.sync_at_start or self.summary.warmup) and self.trainer is not None:
                await self.sync_weights()  # the engines booted on a stand-in or before the warm-up: version 0
            initial = await self.evaluate()  # the eval sets marked at_start (step 0)
            self.summary.initial_evals = dict(self.summary.evals)
            if initial or self.summary.warmup:
                warm = {f"warmup/{k}": v for k, v in self.summary.warmup.items() if isinstance(v, int | float)}
                self.run_dir.append_metrics(0, {"initial": True, **warm, **initial})
            return
        loaded = self.checkpointer.load(RunCheckpointer.resolve(self.resume))
        assert self.trainer is not None
        await self.trainer.load(str(loaded.trainer_dir))
        state = loaded.state
        self.step, self.version = int(state["step"]), int(state["policy_version"])
        self._checkpointed = self.step
        self.ledger.load_state_dict(state["ledger"])
        await self.rollout.load_state_dict(state["scheduler"])
        self.pending = [batch_from_state(b) for b in state.get("pending", [])]
        self._wall_before = self.summary.restore_running(state.get("summary") or
                                                         {"prompts_trained": self.ledger.trained_count()})
        self.summary.resumed_from = str(loaded.path)
        self.run_dir.rewind(self.step)
        await self.sync_weights()

    async def run(self) -> RunSummary:
        """Runs until ``train.steps`` steps are done or the data runs out; returns the summary (of
        the whole run, the part before a resumed checkpoint included)."""
        started = self._started = time.perf_counter()
        await self.start()
        mode = "rollout_only" if self.settings.rollout_only else self.settings.mode
        try:
            if mode == "rollout_only":
                await self._rollout_only()
            elif mode == "sync":
                await self._run_sync()
            elif mode == "one_step_off":
                await self._run_one_step_off()
            elif mode == "bounded_staleness":
                await self._run_bounded()
            else:
                raise ValueError(f"mode={mode!r}: expected 'sync', 'one_step_off' or 'bounded_staleness'")
        except RepeatedFailureError as exc:  # the code under training fails every time: stop, with where
            cause = getattr(exc, "cause", None) or exc  # through Ray: the rollout actor's own exception
            self.summary.steps, self.summary.policy_version = self.step, self.version
            self.summary.stopped_because = str(cause)
            self.run_dir.write_summary(self.summary.to_dict())
            raise cause from None
        finally:
            await self._stop_collector()
        if not self.settings.rollout_only:
            final_eval = await self.evaluate(final=True)
            if final_eval:
                self.run_dir.append_metrics(self.step, {"final": True, **final_eval})
            if self.settings.save_final and self.checkpointer is not None and self._checkpointed != self.step:
                await self.checkpoint()
        self.summary.steps, self.summary.policy_version = self.step, self.version
        self.summary.wall_s = self._wall_before + time.perf_counter() - started
        if self.step == 0 and not self.settings.rollout_only and self.summary.failed_groups:
            failed = sum(self.summary.failed_groups.values())
            self.summary.stopped_because = (f"no prompt group could be completed ({failed} failed: "
                                            f"{failures_text(self.summary.failed_groups, self.summary.failure_examples)})")
            self.run_dir.write_summary(self.summary.to_dict())
            raise NoTrainableGroupsError(f"the run trained nothing: {self.summary.stopped_because}")
        self.run_dir.write_summary(self.summary.to_dict())
        for cb in self.callbacks:
            cb.on_run_end(self.summary)
        return self.summary

    def _more_steps(self) -> bool:
        if self._data_done:
            self.summary.stopped_because = "data exhausted"
            return False
        if self.settings.steps is not None and self.step >= self.settings.steps:
            self.summary.stopped_because = f"train.steps={self.settings.steps} reached"
            return False
        return True

    def _note_data(self, batch: StepBatch) -> bool:
        """Marks the data done when a batch came back short, counts and tells its failed groups;
        returns whether it has groups."""
        report = batch.report
        if report.data_exhausted:
            self._data_done = True
        for reason, count in report.failed.items():
            self.summary.failed_groups[reason] = self.summary.failed_groups.get(reason, 0) + count
        for reason, example in report.failure_examples.items():
            self.summary.failure_examples.setdefault(reason, example)
        if report.failed:
            self._notice(f"step {self.step + 1}: {sum(report.failed.values())} prompt group(s) failed: "
                         + failures_text(report.failed, report.failure_examples))
        for kind, example in report.error_examples.items():  # each kind of error told once, on its first step
            if kind not in self.summary.error_examples:
                self.summary.error_examples[kind] = example
                self._notice(f"step {self.step + 1}: first {kind} error ({report.errors.get(kind, 1)} this step): "
                             f"{example}")
        return bool(batch.groups)

    def _notice(self, text: str) -> None:
        for cb in self.callbacks:
            hook = getattr(cb, "on_notice", None)
            if hook is not None:
                hook(text)

    async def _train(self, batch: StepBatch, timing: dict[str, float]) -> dict[str, Any]:
        self._check_staleness(batch)
        teacher = await self.score_teacher(batch)
        t0 = time.perf_counter()
        tb = self.compute_advantages(batch)
        t1 = time.perf_counter()
        metrics: dict[str, Any] = {**teacher, **(tb.metrics if tb is not None else {}), **await self.train_step(tb)}
        t2 = time.perf_counter()
        self.step += 1
        self.version += 1
        if metrics.get("train/skipped") == 1.0:
            self.summary.skipped_steps += 1
            episodes = batch.episodes()
            unscored = sum(1 for ep in episodes if ep.trajectory.error_of(ErrorKind.REWARD, ErrorKind.REWARD_TIMEOUT))
            why = ("nothing to train: no episode had a trainable token" if tb is None else
                   f"the reward failed on every episode ({unscored}; scored 0.0, its first error told above)"
                   if episodes and unscored == len(episodes) else
                   "every group's advantages were zero (all members of each group got the same reward)")
            self._notice(f"step {self.step} changed no weight: {why}")
        timing.update({"time/advantages_s": t1 - t0, "time/train_s": t2 - t1})
        return metrics

    async def _finish_step(self, batch: StepBatch, metrics: dict[str, Any], timing: dict[str, float],
                           step_started: float) -> None:
        t0 = time.perf_counter()
        metrics.update(await self.evaluate())
        timing["time/eval_s"] = time.perf_counter() - t0
        metrics.update(step_metrics(batch))
        metrics["policy_version"] = self.version
        timing["time/step_s"] = time.perf_counter() - step_started
        metrics.update(timing)
        self.summary.last_metrics = metrics
        await self.record(batch, metrics)
        every = self.settings.checkpoint_every
        if every is not None and self.step % every == 0:
            t1 = time.perf_counter()
            await self.checkpoint()
            metrics["time/checkpoint_s"] = time.perf_counter() - t1

    async def _run_sync(self) -> None:
        while self._more_steps():
            step_started = time.perf_counter()
            batch = self.pending.pop(0) if self.pending else await self.collect_rollouts()
            timing = {"time/collect_s": time.perf_counter() - step_started}
            if not self._note_data(batch):
                continue
            metrics = await self._train(batch, timing)
            t0 = time.perf_counter()
            metrics.update(await self.sync_weights())
            timing["time/sync_s"] = time.perf_counter() - t0
            await self._finish_step(batch, metrics, timing, step_started)

    async def _run_one_step_off(self) -> None:
        next_batch: asyncio.Task[StepBatch] | None = None
        try:
            while self._more_steps():
                step_started = time.perf_counter()
                if self.pending:
                    batch = self.pending.pop(0)
                elif next_batch is not None:
                    batch, next_batch = await next_batch, None
                else:
                    batch = await self.collect_rollouts()
                timing = {"time/collect_wait_s": time.perf_counter() - step_started}
                if not self._note_data(batch):
                    continue
                last = self.settings.steps is not None and self.step + 1 >= self.settings.steps
                if not last and not self._data_done:
                    next_batch = asyncio.ensure_future(self.collect_rollouts())  # generates with the old weights
                metrics = await self._train(batch, timing)
                t0 = time.perf_counter()
                if next_batch is not None:  # drain: no update lands while a request is generated
                    done = await next_batch
                    next_batch = None
                    self.pending.append(done)
                timing["time/drain_s"] = time.perf_counter() - t0
                t1 = time.perf_counter()
                metrics.update(await self.sync_weights())
                timing["time/sync_s"] = time.perf_counter() - t1
                await self._finish_step(batch, metrics, timing, step_started)
        finally:
            if next_batch is not None:
                next_batch.cancel()

    # -- bounded staleness -------------------------------------------------------------------------
    async def _collect_forever(self) -> None:
        assert self._queue is not None
        try:
            while not self._stop_collecting:
                if self._hold.is_set():
                    self._idle.set()
                    while self._hold.is_set() and not self._stop_collecting:
                        await asyncio.sleep(0.01)
                    self._idle.clear()
                    continue
                if not self._queue.empty():
                    # the queued batch is not taken yet: a batch collected now would be handed over while
                    # two updates (the step in training and the queued one) still come before it is trained
                    await asyncio.sleep(0.01)
                    continue
                batch = await self.collect_rollouts()
                await self._queue.put(batch)
                if batch.report.data_exhausted:
                    return
        except BaseException as exc:  # handed to the trainer side, which raises it
            if not isinstance(exc, asyncio.CancelledError):
                await self._queue.put(exc)
            raise
        finally:
            self._idle.set()

    async def _quiesce(self) -> None:
        """Stops the collector between batches (for a checkpoint) and moves queued batches to pending."""
        assert self._queue is not None
        self._hold.set()
        while True:
            while not self._queue.empty():  # a collector blocked on a full queue can then finish its put
                item = self._queue.get_nowait()
                if isinstance(item, BaseException):
                    raise item
                self.pending.append(item)
            if self._idle.is_set() and self._queue.empty():
                return
            await asyncio.sleep(0.01)

    async def _run_bounded(self) -> None:
        self._queue = asyncio.Queue(maxsize=1)
        self._collector = asyncio.ensure_future(self._collect_forever())
        while self._more_steps():
            step_started = time.perf_counter()
            if self.pending:
                batch = self.pending.pop(0)
            else:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                batch = item
            timing = {"time/collect_wait_s": time.perf_counter() - step_started}
            if not self._note_data(batch):
                continue
            metrics = await self._train(batch, timing)
            t0 = time.perf_counter()
            metrics.update(await self.sync_weights())  # pause, load, resume: requests keep running
            timing["time/sync_s"] = time.perf_counter() - t0
            checkpoint_now = self.settings.checkpoint_every is not None and \
                self.step % self.settings.checkpoint_every == 0
            if checkpoint_now:
                await self._quiesce()
            await self._finish_step(batch, metrics, timing, step_started)
            if checkpoint_now:
                self._hold.clear()
        if self.settings.save_final and self.checkpointer is not None:
            await self._quiesce()

    async def _stop_collector(self) -> None:
        task, self._collector = self._collector, None
        if task is None:
            return
        self._stop_collecting = True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def _check_staleness(self, batch: StepBatch) -> None:
        bound = self.settings.max_staleness
        if self.settings.mode != "bounded_staleness" or bound is None:
            return
        for group in batch.groups:
            versions = group.weight_versions()
            if versions and self.version - min(versions) > bound:
                raise StalenessError(
                    f"group {group.group_id} (prompt {group.prompt_id}) has tokens of weight version {min(versions)} "
                    f"but the trainer is at version {self.version}: staleness {self.version - min(versions)} exceeds "
                    f"max_staleness={bound}")

    async def _rollout_only(self) -> None:
        while self._more_steps():
            started = time.perf_counter()
            batch = await self.collect_rollouts()
            if not self._note_data(batch):
                continue
            self.step += 1
            metrics = step_metrics(batch)
            metrics["time/collect_s"] = time.perf_counter() - started
            await self.record(batch, metrics)


def _group_order(group: RolloutGroup) -> tuple[int, int, str]:
    pid = group.prompt_id
    return (group.epoch, int(pid) if pid.isdigit() else -1, pid)
