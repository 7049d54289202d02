"""The supervised warm-up before RL (``warmup`` section): it trains the run's own backend on
conversations laid out as the agent loop lays them out, checks the held-out token accuracy, stops
early once the check passes, fails clearly when it cannot, resets the optimiser for RL; and through
the runner (fake engine, real trainer) the warmed-up weights reach the engines as version 0 and the
``at_start`` eval sets measure them before the first step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.sft import arithmetic_conversations

pytestmark = pytest.mark.timeout(600)


def _conversations(path: Path, n: int, seed: int, direct_rate: float = 0.0) -> Path:
    rows = make_arithmetic_rows(n, seed=seed)
    path.write_text("".join(json.dumps(c) + "\n" for c in arithmetic_conversations(rows, seed=seed,
                                                                                  direct_rate=direct_rate)))
    return path


def _config(tmp_path: Path, warmup: dict[str, Any], **extra: Any) -> Any:
    from agentrl.runner.config import RunConfig
    from agentrl.testing.runner import fake_run_config

    base = fake_run_config(tmp_path, steps=1, rows=8, checkpoint_every=None).to_dict()
    base["warmup"] = warmup
    base.update(extra)
    return RunConfig.from_dict(base)


def _service(config: Any) -> Any:
    from agentrl.runner.trainer import TrainService

    return TrainService.from_config(config, threads=1)


def test_the_check_stops_the_warmup_once_it_passes_and_rl_starts_fresh(tmp_path: Path) -> None:
    data = _conversations(tmp_path / "sft.jsonl", 24, seed=1)
    held = _conversations(tmp_path / "held.jsonl", 8, seed=2)
    config = _config(tmp_path, {"data": str(data), "steps": 60, "batch_size": 8, "log_every": 5,
                                "optimizer": {"lr": 3e-3, "warmup_steps": 2},
                                "check": {"path": str(held), "min_token_accuracy": 0.3, "every_steps": 5}})
    service = _service(config)
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    report = service.warmup(str(run))
    assert report["passed"] is True and report["steps"] < 60 and report["steps"] % 5 == 0
    assert report["checks"][-1][1] >= 0.3 and all(a < 0.3 for _, a in report["checks"][:-1])
    assert report["last_loss"] < report["first_loss"]
    assert json.loads((run / "warmup.json").read_text())["steps"] == report["steps"]
    lines = [json.loads(x) for x in (run / "warmup_metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(5, report["steps"] + 1, 5))
    assert all(type(m["step"]) is int for m in lines)  # the warm-up's step, not the backend's float counter
    assert all("token_accuracy" in m for m in lines)
    assert service.backend.optimizer.state == {} and service.backend.step == 0  # fresh for RL


def test_with_lora_the_warmup_trains_the_adapter_and_leaves_the_base_alone(tmp_path: Path) -> None:
    import torch

    data = _conversations(tmp_path / "sft.jsonl", 24, seed=1)
    config = _config(tmp_path, {"data": str(data), "steps": 6, "batch_size": 8, "optimizer": {"lr": 1e-2}})
    config = type(config).from_dict({**config.to_dict(), "train": {**config.to_dict()["train"], "lora": {"rank": 8}}})
    service = _service(config)
    adapter = service.backend.adapter
    assert adapter is not None
    frozen = {n: p.detach().clone() for n, p in service.backend.model.named_parameters() if not p.requires_grad}
    report = service.warmup(str(tmp_path))
    assert report["steps"] == 6 and report["last_loss"] < report["first_loss"] - 0.3, report
    assert all(torch.equal(p, frozen[n]) for n, p in service.backend.model.named_parameters() if n in frozen)
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in adapter.state_dict().items())
    assert service.backend.optimizer.state == {} and service.backend.step == 0  # fresh for RL


def test_after_the_passing_check_the_cooldown_decays_the_lr_to_zero_and_checks_again(tmp_path: Path) -> None:
    data = _conversations(tmp_path / "sft.jsonl", 24, seed=1)
    held = _conversations(tmp_path / "held.jsonl", 8, seed=2)
    config = _config(tmp_path, {"data": str(data), "steps": 60, "batch_size": 8, "log_every": 1,
                                "cooldown_steps": 4, "optimizer": {"lr": 3e-3, "warmup_steps": 2},
                                "check": {"path": str(held), "min_token_accuracy": 0.3, "every_steps": 5}})
    service = _service(config)
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    report = service.warmup(str(run))
    passed_at = report["cooldown_from"]
    assert passed_at is not None and passed_at % 5 == 0 and passed_at < 60
    assert report["steps"] == passed_at + 4 and report["passed"] is True
    # the check that started the cool-down, then one at its end; none in between
    assert [s for s, _ in report["checks"]][-2:] == [passed_at, passed_at + 4]
    assert report["checks"][-2][1] >= 0.3 and report["checks"][-1][1] >= 0.3
    lines = {m["step"]: m for m in map(json.loads, (run / "warmup_metrics.jsonl").read_text().splitlines())}
    assert sorted(lines) == list(range(1, passed_at + 5))
    start = lines[passed_at]["lr"]
    assert [lines[passed_at + k]["lr"] for k in range(1, 5)] == pytest.approx([start * (5 - k) / 5 for k in range(1, 5)])
    assert all("token_accuracy" not in lines[passed_at + k] for k in range(1, 4))
    assert [lines[passed_at + k].get("cooldown_to") for k in range(5)] == [None] + [passed_at + 4] * 4
    assert service.backend.optimizer.state == {} and service.backend.step == 0


def test_a_cooldown_that_loses_the_checked_behaviour_stops_the_run(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.runner import warmup as warmup_module
    from agentrl.runner.warmup import WarmupError

    data = _conversations(tmp_path / "sft.jsonl", 8, seed=1)
    measured = iter([0.2, 0.95, 0.6])  # below, passing (the cool-down starts), below again at its end
    monkeypatch.setattr(warmup_module, "token_accuracy", lambda backend, conversations: next(measured))
    config = _config(tmp_path, {"data": str(data), "steps": 10, "batch_size": 4, "cooldown_steps": 3,
                                "check": {"path": str(data), "min_token_accuracy": 0.9, "every_steps": 1}})
    with pytest.raises(WarmupError) as err:
        _service(config).warmup(None)
    text = str(err.value)
    assert "the check passed at step 2 but after the cool-down (warmup.cooldown_steps=3)" in text
    assert "predicts 60.0% of the held-out" in text and "0.600 at step 5" in text


def test_a_check_that_never_passes_stops_the_run_with_the_figures(tmp_path: Path) -> None:
    from agentrl.runner.warmup import WarmupError

    data = _conversations(tmp_path / "sft.jsonl", 8, seed=1)
    config = _config(tmp_path, {"data": str(data), "steps": 2, "batch_size": 4,
                                "check": {"path": str(data), "min_token_accuracy": 1.0, "every_steps": 1}})
    with pytest.raises(WarmupError) as err:
        _service(config).warmup(None)
    text = str(err.value)
    assert "after 2 steps the model predicts" in text and "below warmup.check.min_token_accuracy=1.0" in text
    assert "at step 1" in text and "at step 2" in text and "more warmup.steps" in text


def test_bad_warmup_data_names_the_file_and_line(tmp_path: Path) -> None:
    from agentrl.runner.warmup import WarmupError

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(WarmupError, match=rf"warmup.data: {bad}:1: messages: no assistant message"):
        _service(_config(tmp_path, {"data": str(bad), "steps": 1})).warmup(None)


def test_warmup_config_mistakes_are_named() -> None:
    from pydantic import ValidationError

    from agentrl.runner._warmup_section import WarmupSection

    with pytest.raises(ValidationError, match="min_steps=5 > steps=2"):
        WarmupSection(data="x.jsonl", steps=2, min_steps=5)
    with pytest.raises(ValidationError, match=r"cooldown_steps=10: the cool-down starts when warmup\.check passes"):
        WarmupSection(data="x.jsonl", steps=2, cooldown_steps=10)
    with pytest.raises(ValidationError, match="min_token_accuracy"):
        WarmupSection.model_validate({"data": "x.jsonl", "steps": 2, "check": {"path": "y", "min_token_accuracy": 2}})


def test_the_runner_loads_the_warmed_up_model_and_evaluates_it_before_step_one(tmp_path: Path) -> None:
    from agentrl.testing.runner import build_fake_runner

    data = _conversations(tmp_path / "sft.jsonl", 8, seed=1)
    held_rows = tmp_path / "held.jsonl"
    held_rows.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(4, seed=9)))
    config = _config(tmp_path, {"data": str(data), "steps": 3, "batch_size": 4})
    as_dict = config.to_dict()
    as_dict["data"]["eval"] = [{"name": "held_out", "path": str(held_rows), "at_start": True, "every_steps": 100}]
    from agentrl.runner.config import RunConfig

    config = RunConfig.from_dict(as_dict)
    runner, _ = build_fake_runner(config)
    summary = asyncio.run(runner.run())
    assert summary.warmup["steps"] == 3 and summary.warmup["passed"] is None
    lines = [json.loads(x) for x in (config.run_dir() / "metrics.jsonl").read_text().splitlines()]
    first = lines[0]
    assert first["step"] == 0 and first["initial"] is True and first["warmup/steps"] == 3
    assert "eval/held_out/mean_reward" in first
    assert summary.initial_evals["held_out"]["mean_reward"] == first["eval/held_out/mean_reward"]
    assert [m["step"] for m in lines[1:] if not m.get("final")] == [1]
    # the engines got the warmed-up weights before the first rollout (version 0), then version 1
    assert (config.run_dir() / "warmup.json").is_file()
    assert runner.rollout.weights.loaded == [0, 1]
    # the step-1 trajectories were sampled by version 0, the warmed-up model
    assert runner.summary.steps == 1


def test_the_driver_hands_each_new_warmup_line_to_the_callbacks_once(tmp_path: Path) -> None:
    """``watch_warmup`` tails ``warmup_metrics.jsonl``: lines of an earlier run in the folder, a line
    still being written, a damaged line and a raising callback do not disturb it; it ends by itself
    once the warm-up writes its report."""
    from agentrl.runner._warmup_watch import warmup_watchers, watch_warmup
    from agentrl.runner.loop import RunCallback

    log, report = tmp_path / "warmup_metrics.jsonl", tmp_path / "warmup.json"
    log.write_text(json.dumps({"step": 5, "loss": 9.0}) + "\n")  # an earlier run's
    report.write_text("{}")
    seen: list[tuple[int, int, dict[str, float]]] = []

    class Recorder(RunCallback):
        def on_warmup_progress(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
            seen.append((step, total_steps, metrics))

    class Broken(RunCallback):
        def on_warmup_progress(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
            raise RuntimeError("a display bug")

    callbacks = [Broken(), RunCallback(), Recorder()]
    assert [type(cb) for cb in warmup_watchers(callbacks)] == [Broken, Recorder]

    async def scenario() -> None:
        watching = asyncio.ensure_future(watch_warmup(tmp_path, 600, warmup_watchers(callbacks), interval_s=0.01))
        with log.open("a") as f:
            f.write(json.dumps({"step": 10, "loss": 1.5, "lr": 1e-3}) + "\n")
            f.flush()
            await asyncio.sleep(0.05)
            f.write('{"step": 20, "loss": 0.')  # half a line: waits for its end
            f.flush()
            await asyncio.sleep(0.05)
            assert [s for s, _, _ in seen] == [10]
            f.write('5, "token_accuracy": 0.9}\nnot json\n{"loss": 1.0}\n[1, 2]\n{"step": 2.5}\n{"step": true}\n'
                    '{"step": 25.0, "loss": 0.75}\n')  # a whole float is a step number
            f.flush()
        await asyncio.sleep(0.05)
        assert not watching.done()
        with log.open("a") as f:
            f.write(json.dumps({"step": 30, "loss": 0.25, "token_accuracy": 1}) + "\n")
            f.write(json.dumps({"step": 35, "loss": 0.2, "cooldown_to": 40}) + "\n")  # the bar's new end
        report.write_text('{"steps": 30}')  # the warm-up's end: a last read, then the watcher stops
        await asyncio.wait_for(watching, timeout=5)

    asyncio.run(scenario())
    assert seen == [(10, 600, {"loss": 1.5, "lr": 1e-3}), (20, 600, {"loss": 0.5, "token_accuracy": 0.9}),
                    (25, 600, {"loss": 0.75}), (30, 600, {"loss": 0.25, "token_accuracy": 1.0}),
                    (35, 40, {"loss": 0.2, "cooldown_to": 40.0})]


def test_the_warmup_progress_lines_and_bar() -> None:
    import io

    from rich.console import Console

    from agentrl.cli.progress import LiveProgress, PlainProgress

    out = io.StringIO()
    plain = PlainProgress(12, stream=out, rollout_every_s=3600.0)
    plain.on_warmup_progress(25, 600, {"loss": 0.41234, "lr": 1e-3})
    plain.on_warmup_progress(50, 600, {"loss": 0.2, "token_accuracy": 0.95})  # within the interval: no line
    assert out.getvalue() == "warm-up step 25/600: loss 0.4123\n"
    plain.rollout_every_s = 0.0
    plain.on_warmup_progress(75, 600, {"loss": 0.1})  # the last check's accuracy stays on the line
    assert out.getvalue().splitlines()[-1] == "warm-up step 75/600: loss 0.1000, token accuracy 0.950"
    plain.on_warmup_progress(80, 100, {"loss": 0.05, "cooldown_to": 100})
    assert out.getvalue().splitlines()[-1] == "warm-up step 80/100: loss 0.0500, token accuracy 0.950, cool-down"
    quiet = io.StringIO()
    PlainProgress(12, stream=quiet, rollout_every_s=None).on_warmup_progress(1, 10, {"loss": 1.0})
    assert quiet.getvalue() == ""

    screen = io.StringIO()
    live = LiveProgress(12, console=Console(file=screen, force_terminal=True, width=160))
    try:
        live.on_phase("warmup", 0)
        live.on_warmup_progress(150, 600, {"loss": 0.05, "token_accuracy": 0.97})
        live.live.refresh()
    finally:
        live.close()
    assert "warm-up (loss 0.0500, token accuracy 0.970)" in screen.getvalue()
    assert "150/600" in screen.getvalue()
