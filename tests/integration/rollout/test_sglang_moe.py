"""A real CPU SGLang engine serving the tiny Qwen3-MoE (float32, ``--enable-return-routed-experts``)
against the torch trainer on the same folder: logprobs agree; the routing the engine returns is the
one a Hugging Face forward picks, for later turns and prefix-cached positions alike; the agent loop
through a real router stores every position's routing; weight updates by disk, tensor and
distributed carry the experts (the post-sync probe holds and the routing follows the new weights).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import torch

from agentrl.chat import ChatTemplate, Message, ToolCallFailure
from agentrl.environments import Environment, StepResult
from agentrl.rollout import (
    AgentConfig,
    ClientConfig,
    EngineGroup,
    InferenceClient,
    RouterConfig,
    RoutingShape,
    SamplingParams,
    SGLangEngine,
    run_episode,
)
from agentrl.runner.probe import LogprobProbe, backend_scorer, probe_sequences
from agentrl.runner.weight_push import PushTarget, WeightPusher
from agentrl.runner.weight_transports import PushLoad
from agentrl.runner.weights import WeightSync, WeightSyncConfig
from agentrl.testing import build_tiny_moe_model
from agentrl.token_data import ROUTED_EXPERTS
from agentrl.train import TorchBackendConfig, TorchTrainBackend
from agentrl.trajectory import SegmentKind, StopReason, Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(600)]

SHAPE = RoutingShape(layers=2, top_k=2, experts=8)
PROMPT = list(range(300, 360))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(moe_engine: str) -> SGLangEngine:
    engine = await SGLangEngine.attach(moe_engine)
    await engine.update_weights_from_disk(build_tiny_moe_model(), "0")  # another module may have moved them
    return engine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(engine: SGLangEngine) -> AsyncIterator[InferenceClient]:
    async with InferenceClient(ClientConfig(base_url=engine.url, max_retries=0)) as c:
        yield c


@pytest.fixture(scope="module")
def hf() -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(build_tiny_moe_model()), dtype=torch.float32)


def hf_routing(model: Any, ids: Sequence[int]) -> np.ndarray:
    """[T, layers, top_k]: the experts a Hugging Face forward of ``ids`` picks (its own router)."""
    picked: dict[int, torch.Tensor] = {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, out, i=i: picked.__setitem__(i, out[2]))
             for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(input_ids=torch.tensor([list(ids)]))
    for h in hooks:
        h.remove()
    return np.stack([picked[i].numpy() for i in range(SHAPE.layers)], axis=1)


def differing(a: np.ndarray, b: np.ndarray) -> int:
    """Positions whose experts differ (as sets) in at least one layer."""
    return int((np.sort(a, axis=-1) != np.sort(b, axis=-1)).any(axis=(1, 2)).sum())


async def test_engine_logprobs_and_routing_equal_the_trainers(client: InferenceClient, hf: Any) -> None:
    result = await client.generate(PROMPT, SamplingParams(max_new_tokens=16, temperature=1.0, sampling_seed=3),
                                   logprob_start_len=0, routed_experts=SHAPE)
    full = [*PROMPT, *result.output_ids]
    engine_lp = np.array([*result.input_logprobs[1:], *result.output_logprobs], dtype=np.float64)
    trainer = TorchTrainBackend.from_pretrained(build_tiny_moe_model(), TorchBackendConfig(device="cpu",
                                                                                         dtype="float32"))
    trainer_lp = np.array(backend_scorer(trainer)([full])[0][1:])
    mean = float(np.abs(engine_lp - trainer_lp).mean())
    rows = result.routed_experts
    assert rows is not None and rows.shape == (len(full) - 1, 2, 2) and rows.dtype == np.uint8
    own = hf_routing(hf, full[:-1])
    print(f"engine vs trainer (fp32): mean |dlogprob| {mean:.2e} over {len(engine_lp)} tokens; "
          f"{differing(rows, own)} of {len(rows)} positions routed differently")
    assert mean <= 1e-4  # the acceptance bound; the uniform distribution of a broken MoE path is ~1.5 nats off
    assert differing(rows, own) <= len(rows) // 50  # both in float32: at most near-ties differ


async def test_a_later_request_gets_the_new_positions_and_cached_ones_come_back_equal(
        client: InferenceClient, hf: Any) -> None:
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = await client.generate(PROMPT[:40], sampling, routed_experts=SHAPE)
    turn = [*PROMPT[:40], *first.output_ids, 77, 78, 79]  # the reply, then an "environment" span
    held = 40 + len(first.output_ids) - 1
    second = await client.generate(turn, sampling, routed_experts=SHAPE, routed_experts_start=held)
    assert second.cached_tokens > 0  # the first request's tokens were served from the prefix cache
    assert second.routed_experts is not None and second.routed_experts_start == held
    assert len(second.routed_experts) == len(turn) + len(second.output_ids) - 1 - held  # only what was missing
    again = await client.generate(turn, sampling, routed_experts=SHAPE)  # everything, cached prefix included
    assert np.array_equal(again.routed_experts[:held], first.routed_experts)
    assert np.array_equal(again.routed_experts[held:], second.routed_experts)
    full = [*turn, *second.output_ids]
    assert differing(again.routed_experts, hf_routing(hf, full[:-1])) <= 2


class FollowUps(Environment):
    """A user follows up once, whatever the model said."""

    async def reset(self) -> list[Message]:
        return [Message(role="user", content="What is 2**10?")]

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        self._begin_step()
        if self.turns == 1:
            return StepResult(messages=[Message(role="user", content="And 2**11?")])
        return self._finish(StepResult(), StopReason.ENV_DONE)

    def reward(self, trajectory: Trajectory) -> float:
        return 0.0


async def test_an_episode_through_the_router_stores_every_positions_routing(
        engine: SGLangEngine, hf: Any, tok: Any, tmp_path: Path) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    # the random model rarely ends a turn by itself: every id stops a turn once it has two tokens, so the
    # follow-up question comes (appended or forked, as the bridge finds) and a second turn is sampled
    sampling = SamplingParams(max_new_tokens=8, min_new_tokens=2, temperature=1.0,
                              stop_token_ids=tuple(range(len(tok))))
    group = await EngineGroup.attach([engine.url], RouterConfig(log_dir=tmp_path))
    try:
        async with group.client() as client:
            episode = await run_episode(FollowUps({}), template, client, AgentConfig(
                sampling=sampling, routed_experts=SHAPE), group_id="g")
    finally:
        await group.shutdown()  # an attached engine keeps running
    assert sum(len(t.segments_of(SegmentKind.MODEL)) for t in episode.sequences) == 2  # two turns
    for traj in episode.sequences:
        channel = traj.channels[ROUTED_EXPERTS]
        assert channel.present[:-1].all() and not channel.present[-1]
        assert differing(channel.values[:-1], hf_routing(hf, traj.tokens[:-1])) <= 2
    metrics = episode.trajectory.metrics
    assert metrics["routing/missing_tokens"] == 0 and "routing/missing_answers" not in metrics
    assert metrics["routing/rows"] == sum(len(t.tokens) - 1 for t in episode.sequences)  # none twice


@pytest.mark.parametrize("method", ["disk", "tensor", "distributed"])
async def test_weight_updates_carry_the_experts(method: str, engine: SGLangEngine, client: InferenceClient,
                                                tok: Any, tmp_path: Path) -> None:
    backend = TorchTrainBackend.from_pretrained(build_tiny_moe_model(seed=1),
                                                TorchBackendConfig(device="cpu", dtype="float32"))
    with torch.no_grad():  # a "trained" step: the experts and routers move too
        for name, p in backend.model.named_parameters():
            p.add_(0.05 * torch.randn_like(p) * ("experts" in name or "gate" in name))
    if method == "disk":
        sync = WeightSync([engine], tmp_path / "w", WeightSyncConfig(retry_delay_s=0.0))
        report = await sync.sync(7, backend.export_hf)
    else:
        pusher = WeightPusher(backend.named_weights, method=method, dtype=torch.float32, bucket_bytes=256 << 10,
                              device=torch.device("cpu"))

        class Local:
            async def push(self, version: int, targets: list[PushTarget], *, flush: bool, exact: bool) -> Any:
                import asyncio
                return (await asyncio.to_thread(pusher.push, version, targets, flush=flush)).to_dict()

        sync = WeightSync([engine], tmp_path / "w", WeightSyncConfig(retry_delay_s=0.0),
                          transport=PushLoad(method, Local(), lambda e: PushTarget(url=e.url, group=f"moe-{method}")))
        report = await sync.sync(7, backend.export_hf)
    assert report.engines_updated == (engine.url,)
    probe = LogprobProbe(probe_sequences(tok, n=3, length=40, seed=1), bound=1e-3, prompt_length=1)
    figures = await probe.check(client, backend_scorer(backend), expected_version="7")
    result = await client.generate(PROMPT, SamplingParams(max_new_tokens=1, temperature=0.0), routed_experts=SHAPE)
    own = hf_routing(backend.model, PROMPT)
    print(f"{method}: post-sync probe mean |dlogprob| {figures.mean:.2e}; routing differs at "
          f"{differing(result.routed_experts, own)} of {len(own)} positions")
    assert figures.mean <= 1e-4
    assert differing(result.routed_experts, own) <= 2
    await engine.update_weights_from_disk(build_tiny_moe_model(), "0")
