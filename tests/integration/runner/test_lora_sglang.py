"""LoRA end to end on a real CPU SGLang engine serving adapters (``--enable-lora``, the ``torch_native``
kernels; its flags derived from ``train.lora`` by the run's own config): the tiny Qwen3 in float32,
rank 8, three steps of ``ToyArithmeticEnv`` through the router, the torch trainer in this process.

Checked in one run: the start-up check (a probe adapter of fixed random weights moves the trainer's
logprobs by far more than the bound, and the engine through it agrees with the trainer); after each
step only the adapter travels (``tensor``: shared memory, ``/load_lora_adapter_from_tensors``) under a
new name, the old one is unloaded, and the post-sync probe *through the adapter* passes; step 1's
engine-vs-trainer mismatch is at the disk-sync level; trajectory segments carry the adapter version.
Then, in the same test, the same merged weights are synced whole (``tensor`` again, the base model's
every weight) and probed without the adapter: the two probe figures agree, and the bytes and seconds
of both syncs are printed side by side.

A second run puts a zeroed adapter where the probe adapter should be: it stops at start with the
check's message, before any rollout. Last, ``agentrl serve MODEL --adapter DIR``'s engine (an engine of
its own) serves an adapter by name and the base without it.

One engine for the module (booting one costs 40-90 s on two cores); each test gives it back the
tiny model's weights and no adapter.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file, save_file

from agentrl.environments import make_arithmetic_rows
from agentrl.rollout import SGLangEngine
from agentrl.rollout.client import ClientConfig, InferenceClient
from agentrl.rollout.health import EngineGroup
from agentrl.runner import RunCallback, RunConfig, Runner, RunnerError
from agentrl.runner._launch import _assemble
from agentrl.runner.cpu import plan_cpu
from agentrl.runner.envs import environment_factory
from agentrl.runner.loop import LoopSettings
from agentrl.runner.probe import probe_sequences
from agentrl.runner.rollout_service import RolloutService, _score_with
from agentrl.runner.rundir import RunDirectory
from agentrl.runner.sides import LocalTrainer
from agentrl.runner.trainer import TrainService
from agentrl.runner.weight_push import PushTarget, WeightPusher
from agentrl.runner.weight_transports import PushLoad
from agentrl.runner.weights import WeightSync, WeightSyncConfig
from agentrl.testing import build_tiny_model
from agentrl.testing.runner import index_reward

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(900)]

MEAN_BOUND, MAX_BOUND = 1e-4, 1e-3   # as the full-weight runner test: float32 both sides, kernels differ


def make_config(tmp_path: Path, url: str | None, **lora: Any) -> RunConfig:
    data = tmp_path / "train.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in make_arithmetic_rows(16, seed=0)))
    engines: dict[str, Any] = {"context_length": 1024, "max_total_tokens": 8192, "random_seed": 0,
                               "startup_timeout_s": 600}
    if url is not None:
        engines["urls"] = [url]
    return RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data), "seed": 1}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"engines": engines, "sampling": {"max_new_tokens": 40, "temperature": 1.0},
                    "scheduler": {"groups_per_step": 2, "group_size": 2}},
        # a learning rate that moves a rank-8 adapter visibly in three steps
        "train": {"steps": 3, "optimizer": {"lr": 1e-2}, "max_tokens_per_micro_batch": 2048,
                  "lora": {"rank": 8, "alpha": 16, **lora}},
        "sync": {"method": "tensor"},
        "logging": {"run_dir": str(tmp_path / "run")},
        "checkpoint": {"save_final": False},
    })


@pytest.fixture(scope="module")
def lora_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An engine started with the LoRA flags a run derives from ``train.lora`` (rank 8)."""
    config = make_config(tmp_path_factory.mktemp("lora-config"), None)
    cpu = plan_cpu(engines=1)
    engine_config = dataclasses.replace(config.engine_config(), env=cpu.engine_env(0),
                                        log_dir=tmp_path_factory.mktemp("lora-engine"),
                                        extra_args=("--sleep-on-idle",))
    assert engine_config.lora is not None and engine_config.lora.max_rank == 8
    import asyncio

    engine = asyncio.run(SGLangEngine.launch(engine_config))
    try:
        if engine.process is not None:
            cpu.pin(0, engine.process.pid)
        yield engine.url
    finally:
        engine.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def engine(lora_engine: str) -> AsyncIterator[SGLangEngine]:
    """The module's engine with the tiny model's weights and no adapter, before and after each test."""
    engine = await SGLangEngine.attach(lora_engine)

    async def reset() -> None:
        for name in await engine.lora_adapters():
            await engine.unload_lora_adapter(name)
        await engine.update_weights_from_disk(build_tiny_model(), "0")

    await reset()
    yield engine
    await reset()


class _Watch(RunCallback):
    """After every step: the metrics and the adapters the engine has loaded."""

    def __init__(self, engine: SGLangEngine) -> None:
        self.engine = engine
        self.metrics: list[dict[str, Any]] = []
        self.adapters: list[list[str]] = []

    async def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.metrics.append(dict(metrics))
        self.adapters.append(await self.engine.lora_adapters())


def _runner(config: RunConfig, group: EngineGroup, service: TrainService, probes: list[list[int]],
            callbacks: tuple[RunCallback, ...] = ()) -> Runner:
    rollout = _assemble(RolloutService, config, environment_factory(config, reward=index_reward), group, None)
    trainer = LocalTrainer(service)
    rollout.set_pusher(trainer)  # tensor: the trainer hands its adapter over itself
    settings = LoopSettings.from_config(config, probe_sequences=probes, probe_bound=MEAN_BOUND)
    return Runner(rollout, trainer, settings, run_dir=RunDirectory(config.run_dir(), config_hash=config.hash()),
                  callbacks=callbacks)


class _Pusher:
    def __init__(self, pusher: WeightPusher) -> None:
        self.pusher = pusher

    async def push(self, version: int, targets: list[PushTarget], *, flush: bool, exact: bool) -> dict[str, Any]:
        import asyncio

        return (await asyncio.to_thread(self.pusher.push, version, targets, flush=flush)).to_dict()


async def test_three_lora_steps_sync_the_adapter_alone_and_probe_through_it(
        tmp_path: Path, engine: SGLangEngine, tok: Any) -> None:
    config = make_config(tmp_path, engine.url)
    assert config.sync_method() == "tensor"
    probes = probe_sequences(tok, n=3, length=24, seed=0)
    group = await EngineGroup.attach([engine.url], config.rollout.router)
    service = TrainService.from_config(config, threads=1)
    watch = _Watch(engine)
    runner = _runner(config, group, service, probes, (watch,))
    try:
        summary = await runner.run()
        await runner.rollout.shutdown()  # waits for the last unloads
        left = await engine.lora_adapters()
    finally:
        await group.shutdown()

    assert summary.steps == 3
    check = summary.adapter_check
    print(f"start-up check: {check}")
    assert check["lora/check_adapter_effect"] > 100 * MEAN_BOUND
    assert check["lora/check_abs_diff"] <= MEAN_BOUND
    assert check["lora/check_base_abs_diff"] > 100 * MEAN_BOUND
    # only the newest adapter stays loaded; each step the engine had the new one (and maybe the old, unloading)
    assert left == ["agentrl-v3"]
    for step, names in enumerate(watch.adapters, start=1):
        assert f"agentrl-v{step}" in names and set(names) <= {f"agentrl-v{step - 1}", f"agentrl-v{step}"}, names
    first = watch.metrics[0]
    print(f"step-1 engine/trainer |Δ| over {first['mismatch/n']:.0f} tokens: mean {first['mismatch/mean']:.3g}, "
          f"max {first['mismatch/max']:.3g}")
    assert first["mismatch/n"] > 0
    assert first["mismatch/mean"] <= MEAN_BOUND and first["mismatch/max"] <= MAX_BOUND
    assert all(m["probe/mean_abs_diff"] <= MEAN_BOUND for m in watch.metrics)
    assert all(m["sync/method_tensor"] == 1.0 for m in watch.metrics)
    adapter_bytes = [m["sync/bytes"] for m in watch.metrics]
    adapter_s = [m["sync/total_s"] for m in watch.metrics]
    for step in (1, 2, 3):
        versions = {s.weight_version for ep in runner.run_dir.read_trajectories(step) for t in ep.sequences
                    for s in t.segments if s.weight_version is not None}
        assert versions == {str(step - 1)}, (step, versions)

    # the same weights, merged and synced whole: the probe agrees, and the adapter was a fraction of the bytes
    adapter = service.backend.adapter
    assert adapter is not None
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in adapter.state_dict().items()), "nothing trained"
    pusher = WeightPusher(service.backend.named_weights, method="tensor", dtype=torch.float32,
                          bucket_bytes=256 << 10, device=torch.device("cpu"))
    full = WeightSync([engine], tmp_path / "full", WeightSyncConfig(retry_delay_s=0.0),
                      transport=PushLoad("tensor", _Pusher(pusher), lambda e: PushTarget(url=e.url, group="lora-t")))
    started = time.perf_counter()
    report = await full.sync(100)
    full_s = time.perf_counter() - started
    full_bytes = report.to_metrics()["sync/bytes"]
    trainer_lp = service.score(probes)
    async with InferenceClient(ClientConfig(base_url=engine.url, max_retries=0)) as client:
        merged_lp = await _score_with(client, probes)   # base weights = merged, no adapter named
    merged_probe = _mean_abs(merged_lp, trainer_lp)
    adapter_probe = watch.metrics[-1]["probe/mean_abs_diff"]
    print(f"probe mean |Δ| through the adapter {adapter_probe:.3g}, after a full sync of the merged weights "
          f"{merged_probe:.3g}; per step adapter {adapter_bytes[-1] / 1e3:.1f} kB in "
          f"{[round(s, 3) for s in adapter_s]} s, full {full_bytes / 1e3:.1f} kB in {full_s:.3f} s "
          f"({full_bytes / adapter_bytes[-1]:.1f}x the bytes)")
    assert merged_probe <= MEAN_BOUND
    assert abs(adapter_probe - merged_probe) <= MEAN_BOUND / 10
    assert adapter_bytes[-1] * 5 < full_bytes


async def test_a_zeroed_adapter_where_the_probe_adapter_should_be_stops_the_run_at_start(
        tmp_path: Path, engine: SGLangEngine, tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path, engine.url)
    service = TrainService.from_config(config, threads=1)
    real = service.probe_adapter

    def zeroed(folder: str, sequences: list[list[int]], seed: int) -> dict[str, Any]:
        out = real(folder, sequences, seed)
        path = Path(folder) / "adapter_model.safetensors"
        save_file({k: torch.zeros_like(v) for k, v in load_file(path).items()}, path)
        return out

    monkeypatch.setattr(service, "probe_adapter", zeroed)
    group = await EngineGroup.attach([engine.url], config.rollout.router)
    runner = _runner(config, group, service, probe_sequences(tok, n=3, length=24, seed=0))
    try:
        with pytest.raises(RunnerError, match="does not apply the adapter") as err:
            await runner.run()
        await runner.rollout.shutdown()
    finally:
        await group.shutdown()
    print(err.value)
    assert runner.step == 0 and not runner.run_dir.read_metrics()


async def test_agentrl_serve_with_an_adapter_serves_it_by_name_and_the_base_without(tmp_path: Path, tok: Any) -> None:
    """``agentrl serve MODEL --adapter DIR``'s engine (its plan, launched for real): requests naming the
    adapter get the trainer's logprobs with that adapter, requests naming the model alone the base's,
    and the OpenAI endpoint takes ``"model": "MODEL:NAME"``."""
    import httpx

    from agentrl.cli.serve import plan_serve
    from agentrl.runner.probe import backend_scorer
    from agentrl.train import TorchTrainBackend
    from agentrl.train.config import LoraSettings, TorchBackendConfig

    backend = TorchTrainBackend.from_pretrained(build_tiny_model(), TorchBackendConfig(
        device="cpu", dtype="float32", lora=LoraSettings(rank=8, alpha=16)))
    assert backend.adapter is not None
    probes = probe_sequences(tok, n=3, length=24, seed=0)
    with backend.adapter.probe_weights(seed=7):
        backend.export_adapter(tmp_path / "my-adapter")
        with_adapter = backend_scorer(backend)(probes)
    base = [list(row) for row in backend.compute_logprobs(_batch(probes), reference=True)]
    plan = plan_serve(build_tiny_model(), device="cpu", adapter=tmp_path / "my-adapter")
    cpu = plan_cpu(engines=1)
    engine = await SGLangEngine.launch(dataclasses.replace(plan.config, env=cpu.engine_env(0), log_dir=tmp_path,
                                                           max_total_tokens=8192, context_length=1024))
    try:
        assert await engine.lora_adapters() == ["my-adapter"]
        async with InferenceClient(ClientConfig(base_url=engine.url, max_retries=0)) as client:
            client.set_adapter("my-adapter")
            through = await _score_with(client, probes)
            client.set_adapter(None)
            plain = await _score_with(client, probes)
        async with httpx.AsyncClient(timeout=120) as http:
            reply = await http.post(f"{engine.url}/v1/chat/completions", json={
                "model": plan.adapter_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    finally:
        engine.stop()
    print(f"served adapter vs trainer {_mean_abs(through, with_adapter):.3g}, base vs trainer base "
          f"{_mean_abs(plain, base):.3g}, adapter effect {_mean_abs(with_adapter, base):.3g}")
    assert _mean_abs(through, with_adapter) <= MEAN_BOUND
    assert _mean_abs(plain, base) <= MEAN_BOUND
    assert _mean_abs(with_adapter, base) > 100 * MEAN_BOUND
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] is not None


def _batch(sequences: list[list[int]]) -> Any:
    from agentrl.train.batching import TrainingBatch, TrainSequence

    return TrainingBatch.from_sequences([
        TrainSequence(tokens=list(s), loss_mask=[0] * len(s), rollout_logprobs=[0.0] * len(s),
                      advantages=[0.0] * len(s), rollout_id=f"p{i}", group_id="p", reward=0.0, denominator=1.0)
        for i, s in enumerate(sequences)])


def _mean_abs(a: list[list[float]], b: list[list[float]]) -> float:
    diffs = [abs(x - y) for r, s in zip(a, b, strict=True) for x, y in zip(r[1:], s[1:], strict=True)]
    return sum(diffs) / len(diffs)
