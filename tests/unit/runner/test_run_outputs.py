"""What a run writes and shows besides its run folder: TensorBoard event files (read back with
TensorBoard's own reader), a W&B offline run (read back from its ``.wandb`` file), the plain
per-step lines and the end-of-run summary. One 2-step run on the fake engine and the real trainer
feeds every check."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from agentrl.cli.progress import LiveProgress, PlainProgress, RunEndSummary, progress_callbacks
from agentrl.runner.logging_sinks import TensorBoardSink, WandbSink, scalar_metrics, sinks_from_config

pytestmark = pytest.mark.timeout(300)

STEPS = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rich.console import Console

    from agentrl.testing.runner import build_fake_runner, fake_run_config

    root = tmp_path_factory.mktemp("outputs")
    config = fake_run_config(root, steps=STEPS, rows=8, checkpoint_every=None)
    lines, screen = io.StringIO(), io.StringIO()
    callbacks: list[Any] = [TensorBoardSink(config.run_dir() / "tensorboard"),
                            PlainProgress(STEPS, stream=lines, phases=True),
                            RunEndSummary(config.run_dir(), console=Console(file=screen, width=200))]
    wandb_dir = root / "wandb-home"
    with pytest.MonkeyPatch.context() as env:
        if _has_wandb():
            env.setenv("WANDB_MODE", "offline")
            env.setenv("WANDB_SILENT", "true")
            env.setenv("WANDB_DIR", str(wandb_dir))
            callbacks.append(WandbSink("agentrl-test", wandb_dir, config=config.to_dict(), name="outputs"))
        runner, _ = build_fake_runner(config, callbacks=callbacks)
        summary = asyncio.run(runner.run())
    metrics = [json.loads(line) for line in (config.run_dir() / "metrics.jsonl").read_text().splitlines()]
    return {"config": config, "summary": summary, "metrics": [m for m in metrics if not m.get("final")],
            "lines": lines.getvalue(), "screen": screen.getvalue(), "wandb_dir": wandb_dir}


def _closed_wandb_files(root: Path) -> list[Path]:
    """The ``.wandb`` files under ``root`` once W&B's service has closed them. ``run.finish()`` only
    tells the service the run is over: the service writes the file's records from its buffer when it
    closes the run's stream, a moment later. ``wandb.teardown()`` waits for the service to exit."""
    import wandb

    wandb.teardown()
    return list(root.rglob("offline-run-*/run-*.wandb"))


def _has_wandb() -> bool:
    try:
        import wandb  # noqa: F401
    except ImportError:
        return False
    return True


def test_scalar_metrics_flattens_and_keeps_finite_numbers() -> None:
    got = scalar_metrics({"a": 1, "b": {"c": 2.5, "d": {"e": True}}, "nan": float("nan"), "s": "x", "l": [1]})
    assert got == {"a": 1.0, "b/c": 2.5, "b/d/e": 1.0}


def test_tensorboard_events_read_back(run: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run["config"].run_dir() / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"rollout/reward_mean", "train/loss", "time/step_s"} <= tags
    assert "prompt_ids" not in tags  # a list, not a scalar
    for key in ("rollout/reward_mean", "train/loss", "train/grad_norm"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == list(range(1, STEPS + 1))
        expected = [m[key] for m in run["metrics"]]
        assert [e.value for e in events] == pytest.approx(expected, rel=1e-6)


def test_wandb_offline_run_holds_the_steps(run: dict[str, Any]) -> None:
    if not _has_wandb():
        pytest.skip("wandb is not installed (pip install 'agentrl[logging]')")
    files = _closed_wandb_files(Path(run["wandb_dir"]))
    assert len(files) == 1, files
    history = _wandb_history(files[0])
    steps = [h["_step"] for h in history]
    assert steps == list(range(1, STEPS + 1))
    assert [h["rollout/reward_mean"] for h in history] == pytest.approx([m["rollout/reward_mean"] for m in run["metrics"]])


def _wandb_history(path: Path) -> list[dict[str, Any]]:
    """The history rows (one per logged step) of an offline W&B run's ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    history: list[dict[str, Any]] = []
    for data in _wandb_records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    return history


def _wandb_records(raw: bytes) -> list[bytes]:
    """The records of a ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks
    of chunks ``crc32 (4) | length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last) | data``."""
    assert raw[:4] == b":W&B", raw[:8]
    out: list[bytes] = []
    pos, pending = 7, b""
    while pos + 7 <= len(raw):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]
        if kind == 0 and length == 0:
            break
        chunk, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        pending += chunk
        if kind in (1, 4):
            out.append(pending)
            pending = b""
    return out


def test_plain_lines_one_per_step_with_figures(run: dict[str, Any]) -> None:
    step_lines = [line for line in run["lines"].splitlines() if "eta=" in line]
    assert [line.split()[1] for line in step_lines] == [f"{s}/{STEPS}" for s in range(1, STEPS + 1)]
    for line, m in zip(step_lines, run["metrics"], strict=True):
        assert f"reward={m['rollout/reward_mean']:.3f}" in line
        assert f"accuracy={m['rollout/accuracy']:.3f}" in line
        assert "tokens/s=" in line and "step_s=" in line
    assert step_lines[-1].endswith("eta=0:00:00")
    assert "step 1 collect_rollouts" in run["lines"] and "step 2 train_step" in run["lines"]


def test_summary_names_the_run_folder_and_its_contents(run: dict[str, Any]) -> None:
    screen = run["screen"]
    assert str(run["config"].run_dir().resolve()) in screen
    assert f"{STEPS} (train.steps={STEPS} reached)" in screen
    assert "metrics.jsonl" in screen and "tensorboard" in screen
    reward = f"{run['metrics'][-1]['rollout/reward_mean']:.3f}"
    assert re.search(rf"last reward\s*│\s*{re.escape(reward)}", screen), screen


def test_live_display_draws_steps_and_phases() -> None:
    from rich.console import Console

    out = io.StringIO()
    live = LiveProgress(4, console=Console(file=out, force_terminal=True, width=150))
    with live:
        live.on_phase("collect_rollouts", 1)
        live.on_step_end(1, {"rollout/reward_mean": 0.25, "rollout/accuracy": 0.125,
                             "report/metrics/tokens_per_s": 321.0, "time/step_s": 0.5})
        live.on_phase("train_step", 2)
        live.live.refresh()
    text = out.getvalue()
    assert "1/4" in text and "step 2: train_step" in text
    assert "0.250" in text and "0.125" in text and "321" in text
    assert not live.live.is_started


def test_progress_callbacks_plain_off_a_terminal(tmp_path: Path) -> None:
    from rich.console import Console

    shown, summary = progress_callbacks(3, tmp_path, console=Console(file=io.StringIO()))
    assert isinstance(shown, PlainProgress) and isinstance(summary, RunEndSummary)
    term = Console(file=io.StringIO(), force_terminal=True)
    quiet, _ = progress_callbacks(3, tmp_path, quiet=True, console=term)
    assert isinstance(quiet, PlainProgress)
    live, _ = progress_callbacks(3, tmp_path, console=term)
    assert isinstance(live, LiveProgress)
    live.close()


def test_sinks_from_config_follow_logging_section(tmp_path: Path) -> None:
    from agentrl.runner.config import RunConfig

    base = {"model": {"path": "m"}, "data": {"train": {"path": "d.jsonl"}}, "environment": {"name": "toy_arithmetic"},
            "logging": {"run_dir": str(tmp_path / "run")}}
    assert sinks_from_config(RunConfig.from_dict(base)) == []
    on = RunConfig.from_dict({**base, "logging": {**base["logging"], "tensorboard": True}})
    sinks = sinks_from_config(on)
    assert [type(s) for s in sinks] == [TensorBoardSink]
    sinks[0].close()
    assert (tmp_path / "run" / "tensorboard").is_dir()


def test_sinks_from_config_start_an_offline_wandb_run_in_the_run_folder(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """logging.wandb=true: a W&B run under the run folder, named after it, in logging.wandb_project,
    holding the run config; the step logged through the sink is read back from its .wandb file."""
    if not _has_wandb():
        pytest.skip("wandb is not installed (pip install 'agentrl[logging]')")
    from agentrl.runner.config import RunConfig

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # the run folder, as the sink asks for
    run_dir = tmp_path / "exp7"
    config = RunConfig.from_dict({"model": {"path": "m"}, "data": {"train": {"path": "d.jsonl"}},
                                  "environment": {"name": "toy_arithmetic"},
                                  "logging": {"run_dir": str(run_dir), "wandb": True,
                                              "wandb_project": "agentrl-sinks-test"}})
    sinks = sinks_from_config(config)
    assert [type(s) for s in sinks] == [WandbSink]
    sink = sinks[0]
    assert isinstance(sink, WandbSink)
    assert sink.run.project == "agentrl-sinks-test" and sink.run.name == "exp7"
    assert dict(sink.run.config)["environment"]["name"] == "toy_arithmetic"
    sink.on_step_end(1, {"rollout/reward_mean": 0.75, "note": "not a scalar"})
    sink.close()
    files = _closed_wandb_files(run_dir)
    assert len(files) == 1, sorted(run_dir.rglob("*"))
    history = _wandb_history(files[0])
    assert [(h["_step"], h["rollout/reward_mean"]) for h in history] == [(1, 0.75)]
    assert all("note" not in h for h in history)


class _ProgressRecorder:
    def __init__(self) -> None:
        self.seen: list[tuple[int, Any]] = []

    def on_phase(self, phase: str, step: int) -> None:
        pass

    def on_rollout_progress(self, step: int, progress: Any) -> None:
        self.seen.append((step, progress))

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def on_run_end(self, summary: Any) -> None:
        pass


def test_rollout_progress_is_reported_while_a_step_collects(tmp_path: Path) -> None:
    """A callback that overrides ``on_rollout_progress`` is told, while each step's rollouts run,
    how many groups are accepted of the target and how many are running; a plain display prints it."""
    from dataclasses import replace

    from agentrl.testing.runner import build_fake_runner, fake_run_config

    recorder, lines = _ProgressRecorder(), io.StringIO()
    plain = PlainProgress(2, stream=lines, rollout_every_s=0.0)
    config = fake_run_config(tmp_path, steps=2, rows=8, checkpoint_every=None, groups_per_step=2)
    runner, _ = build_fake_runner(config, token_delay_s=0.01, callbacks=[recorder, plain])
    runner.settings = replace(runner.settings, progress_interval_s=0.02)
    asyncio.run(runner.run())
    steps = sorted({step for step, _ in recorder.seen})
    assert steps == [1, 2], [(s, p) for s, p in recorder.seen][:5]
    for step in steps:
        seen = [p for s, p in recorder.seen if s == step]
        accepted = [p.accepted_groups for p in seen]
        assert accepted == sorted(accepted) and all(p.target_groups == 2 for p in seen)
        assert all(0 <= a <= 2 for a in accepted)
        assert any(p.running_groups > 0 and p.inflight_requests > 0 for p in seen)
        assert [p.elapsed_s for p in seen] == sorted(p.elapsed_s for p in seen)
    assert runner.rollout.scheduler.progress() is None  # between steps
    assert re.search(r"^step 1 collect_rollouts: \d/2 groups, \d running, \d+ requests, \d+ s$", lines.getvalue(),
                     re.M), lines.getvalue()


def test_live_display_shows_the_rollouts_of_the_step() -> None:
    from rich.console import Console

    from agentrl.rollout import RolloutProgress

    out = io.StringIO()
    live = LiveProgress(4, console=Console(file=out, force_terminal=True, width=160))
    with live:
        live.on_phase("collect_rollouts", 1)
        live.on_rollout_progress(1, RolloutProgress(step=0, accepted_groups=3, target_groups=8, running_groups=5,
                                                    rejected_groups=1, inflight_requests=20, elapsed_s=12.0))
        live.live.refresh()
    text = out.getvalue()
    assert "3/8 groups, 5 running, 20 requests, 1 filtered, 12 s" in text


def test_the_eta_counts_rl_steps_only_not_the_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.cli import progress as progress_module

    clock = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    lines = io.StringIO()
    shown = PlainProgress(11, stream=lines, rollout_every_s=None)
    shown.on_phase("warmup", 0)
    clock[0] += 400.0                      # a 400 s warm-up, then the evaluations at start
    shown.on_phase("evaluate", 0)
    clock[0] += 20.0
    shown.on_phase("collect_rollouts", 1)  # step 1 starts here
    clock[0] += 10.0
    shown.on_step_end(1, {"time/step_s": 10.0})
    assert lines.getvalue().splitlines()[-1].endswith("eta=0:01:40")  # 10 steps left at 10 s each


def test_summary_counts_the_warm_up_in_the_wall_time_and_points_at_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from agentrl.cli import progress as progress_module
    from agentrl.runner.loop import RunSummary

    clock = [50.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    screen = io.StringIO()
    end = RunEndSummary(tmp_path, console=Console(file=screen, width=400))
    clock[0] += 725.0  # the command ran 12 min 5 s; 5 min of it were RL steps
    end.on_run_end(RunSummary(steps=3, wall_s=300.0, stopped_because="train.steps=3 reached",
                              warmup={"steps": 450, "seconds": 397.0, "checks": [[400, 0.93], [450, 0.964]]}))
    text = screen.getvalue()
    assert "0:12:05 in all, 0:05:00 of them in the RL steps" in text
    assert "450 steps in 0:06:37, check 0.964 at step 450" in text
    assert f"agentrl inspect {tmp_path}" in text
    (tmp_path / "inspect").mkdir()
    (tmp_path / "inspect" / "index.html").write_text("<html></html>")
    screen.seek(0), screen.truncate()
    end.on_run_end(RunSummary(steps=3, wall_s=300.0))
    assert re.search(rf"report\s*│\s*{re.escape(str(tmp_path / 'inspect' / 'index.html'))}", screen.getvalue())


@pytest.mark.parametrize(("every", "expected_calls"), [(2, 2), (100, 2), (1, 2)])
def test_the_final_evaluation_reuses_a_set_the_last_step_just_measured(tmp_path: Path, every: int,
                                                                       expected_calls: int) -> None:
    from agentrl.environments import make_arithmetic_rows
    from agentrl.runner.config import RunConfig
    from agentrl.testing.runner import build_fake_runner, fake_run_config

    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(4, seed=9)))
    as_dict = fake_run_config(tmp_path, steps=2, rows=8, checkpoint_every=None).to_dict()
    as_dict["data"]["eval"] = [{"name": "held_out", "path": str(held), "at_start": every != 1, "every_steps": every}]
    config = RunConfig.from_dict(as_dict)
    runner, _ = build_fake_runner(config)
    calls: list[str] = []
    measure = runner.rollout.evaluate

    async def counted(name: str) -> dict[str, Any]:
        calls.append(name)
        return await measure(name)

    runner.rollout.evaluate = counted  # type: ignore[method-assign]
    asyncio.run(runner.run())
    # every=2: before step 1, after step 2 (the final line repeats it); every=100: before step 1 and
    # at the end; every=1 (no at_start): after steps 1 and 2 — the end reuses step 2's
    assert len(calls) == expected_calls, calls
    lines = [json.loads(x) for x in (config.run_dir() / "metrics.jsonl").read_text().splitlines()]
    final = next(m for m in lines if m.get("final"))
    assert final["eval/held_out/mean_reward"] == runner.summary.evals["held_out"]["mean_reward"]
    if every <= 2:
        last = next(m for m in lines if m["step"] == 2 and not m.get("final"))
        assert last["eval/held_out/mean_reward"] == final["eval/held_out/mean_reward"]


def test_the_step_line_shows_episode_errors_by_kind_only_when_there_are_some() -> None:
    lines = io.StringIO()
    progress = PlainProgress(2, stream=lines)
    progress.on_step_end(1, {"rollout/reward_mean": 0.5, "report/errors/engine": 0})
    progress.on_step_end(2, {"rollout/reward_mean": 0.5, "report/errors/reward": 1, "report/errors/engine": 2})
    first, second = lines.getvalue().splitlines()
    assert "errors" not in first and "errors=engine:2,reward:1" in second
