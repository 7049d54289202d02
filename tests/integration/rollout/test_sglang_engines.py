"""Real sglang-router + two real CPU SGLang servers serving the tiny Qwen3 model.

One engine group per module (startup costs ~20-40 s of CPU); the engine-kill test runs last.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from agentrl.rollout import (
    ClientConfig,
    EngineConfig,
    EngineError,
    EngineGroup,
    EnginePortTaken,
    FinishKind,
    HealthConfig,
    InferenceClient,
    PromptTooLongError,
    RouterConfig,
    RouterPolicy,
    SamplingParams,
    SGLangEngine,
)
from agentrl.testing import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(600)]

CONTEXT = 512
PROMPT = [101, 102, 103, 104, 105, 106, 107, 108]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def group(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EngineGroup]:
    logs = tmp_path_factory.mktemp("engine-logs")
    model = str(build_tiny_model())
    configs = [EngineConfig(model_path=model, device="cpu", context_length=CONTEXT, max_total_tokens=4096,
                            random_seed=i, log_dir=logs, startup_timeout_s=300) for i in range(2)]
    g = await EngineGroup.launch(configs, RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING, log_dir=logs),
                                 HealthConfig(check_interval_s=0.5, failure_threshold=3, max_restarts=2))
    g.start_monitor()
    try:
        yield g
    finally:
        await g.shutdown()
        assert all(not e.alive() for e in g.engines) and not g.router.process.alive()


@pytest_asyncio.fixture(loop_scope="module")
async def client(group: EngineGroup) -> AsyncIterator[InferenceClient]:
    async with group.client(backoff_initial_s=0.1, max_retries=6) as c:
        yield c


async def test_engine_that_cannot_start_fails_fast(tmp_path: Path) -> None:
    # a folder that passes the up-front check (tests/unit) but holds no loadable model
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    (broken / "model.safetensors").write_bytes(b"")
    (broken / "tokenizer_config.json").write_text("{}")
    config = EngineConfig(model_path=broken, device="cpu", log_dir=tmp_path, startup_timeout_s=300)
    with pytest.raises(EngineError, match="exited with code") as info:
        await SGLangEngine.launch(config)
    assert "no-such-architecture" in str(info.value)  # the log tail says what went wrong


async def test_engine_whose_port_is_taken_fails_fast_naming_it(tmp_path: Path) -> None:
    # SGLang's server logs the failed bind and then hangs (its scheduler still up): the launch reads the
    # log and stops it instead of waiting out the start-up timeout
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        # a KV budget as the CPU recipe sets it: left to SGLang, sizing one on CPU takes ~14 s of the start
        config = EngineConfig(model_path=str(build_tiny_model()), device="cpu", port=port, log_dir=tmp_path,
                              context_length=1024, max_total_tokens=8192, startup_timeout_s=300)
        with pytest.raises(EnginePortTaken, match=f"127.0.0.1:{port} could not bind its port") as info:
            await SGLangEngine.launch(config)
    assert "address already in use" in str(info.value)
    assert not any(p.info["cmdline"] and f"--port {port} " in " ".join(p.info["cmdline"]) + " "
                   for p in psutil.process_iter(["cmdline"]))  # stopped, not left hanging


async def test_engine_logs_are_free_of_the_routers_grpc_probe(group: EngineGroup) -> None:
    # registering with the router sends each engine a gRPC (HTTP/2) health probe; its log stays quiet
    for engine in group.engines:
        assert engine.process is not None
        assert "Invalid HTTP request received" not in engine.process.log_path.read_text(errors="replace")


async def test_constrained_decoding_and_logit_bias_reach_the_engine(group: EngineGroup,
                                                                    client: InferenceClient) -> None:
    regex = await client.generate(PROMPT, SamplingParams(max_new_tokens=8, regex="[0-9]{3}"), routing_key="regex")
    assert regex.text.removesuffix("<|im_end|>").isdigit() and len(regex.text.removesuffix("<|im_end|>")) == 3
    with pytest.raises(ValueError, match="logit_bias would be dropped by sglang-router"):
        await client.generate(PROMPT, SamplingParams(max_new_tokens=4, logit_bias={1234: 100.0}))
    async with InferenceClient(ClientConfig(base_url=group.engines[0].url)) as direct:
        biased = await direct.generate(PROMPT, SamplingParams(max_new_tokens=6, ignore_eos=True,
                                                              logit_bias={1234: 100.0}))
    assert biased.output_ids == (1234,) * 6


async def test_generate_with_logprobs_and_rescore(client: InferenceClient) -> None:
    res = await client.generate(PROMPT, SamplingParams(max_new_tokens=16, temperature=1.0), routing_key="rescore")
    assert res.finish_reason.kind is FinishKind.LENGTH
    assert len(res.output_ids) == len(res.output_logprobs) == res.completion_tokens == 16
    assert res.prompt_tokens == len(PROMPT) and res.weight_version is not None
    assert all(lp <= 0.0 for lp in res.output_logprobs) and any(lp < -0.01 for lp in res.output_logprobs)
    # SGLang re-scores prompt + returned ids: the prompt-side logprobs of the generated positions must
    # equal the logprobs returned with the generation (up to bf16 noise)
    full = PROMPT + list(res.output_ids)
    score = await client.generate(full, SamplingParams(max_new_tokens=0), logprob_start_len=0, routing_key="rescore")
    assert score.first_misscored(full) is None
    assert score.input_logprobs[0] is None
    rescored = score.input_logprobs[len(PROMPT):]
    assert rescored == pytest.approx(res.output_logprobs, abs=0.05)


async def test_matched_stop_token_is_returned_with_its_logprob(client: InferenceClient) -> None:
    first = await client.generate(PROMPT, GREEDY, routing_key="stop")
    stop_id = first.output_ids[2]
    res = await client.generate(PROMPT, GREEDY.replace(stop_token_ids=(stop_id,)), routing_key="stop")
    assert res.finish_reason.kind is FinishKind.STOP and res.finish_reason.matched == stop_id
    assert res.output_ids[-1] == stop_id and res.output_ids == first.output_ids[: len(res.output_ids)]
    assert len(res.output_logprobs) == len(res.output_ids)


async def test_abort_mid_generation_returns_partial_result(group: EngineGroup, client: InferenceClient) -> None:
    params = SamplingParams(max_new_tokens=CONTEXT - len(PROMPT) - 4, ignore_eos=True)
    task = asyncio.ensure_future(client.generate(PROMPT, params, rid="to-abort", routing_key="abort"))
    await _until_serving(group.engines, task)
    await asyncio.sleep(0.2)  # a few tokens in (the request is ~500 tokens long: over a second on free cores)
    assert not task.done()
    await client.abort("to-abort")
    res = await asyncio.wait_for(task, 60)
    assert res.aborted and res.finish_reason.kind is FinishKind.ABORT
    assert 0 < len(res.output_ids) < params.max_new_tokens
    assert len(res.output_logprobs) == len(res.output_ids)


async def test_drain_aborts_everything_and_engines_go_idle(group: EngineGroup, client: InferenceClient) -> None:
    params = SamplingParams(max_new_tokens=CONTEXT - len(PROMPT) - 4, ignore_eos=True)
    tasks = [asyncio.ensure_future(client.generate(PROMPT, params, routing_key=f"drain-{i}")) for i in range(4)]
    await _until_serving(group.engines, *tasks, count=4)
    await group.drain(timeout_s=60)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert all(r.aborted and len(r.output_ids) == len(r.output_logprobs) < params.max_new_tokens for r in results)
    assert [await e.active_requests() for e in group.engines] == [0, 0]


async def test_too_long_prompt_is_rejected_not_retried(client: InferenceClient) -> None:
    with pytest.raises(PromptTooLongError, match="context length"):
        await client.generate([5] * (CONTEXT + 10), SamplingParams(max_new_tokens=4))


async def test_consistent_hashing_keeps_a_session_on_one_engine(group: EngineGroup,
                                                               client: InferenceClient) -> None:
    # Label each engine with its own weight version: the result then names the engine that served it.
    for i, engine in enumerate(group.engines):
        await engine.update_weight_version(f"engine-{i}")
    served: dict[str, set[str | None]] = {}
    for key in [f"session-{i}" for i in range(8)]:
        for _ in range(3):
            res = await client.generate(PROMPT, SamplingParams(max_new_tokens=2), routing_key=key)
            served.setdefault(key, set()).add(res.weight_version)
    assert all(len(v) == 1 for v in served.values()), served
    assert set().union(*served.values()) == {"engine-0", "engine-1"}


async def test_weight_update_from_disk_changes_version_and_outputs(group: EngineGroup,
                                                                   client: InferenceClient) -> None:
    before = await client.generate(PROMPT, GREEDY, routing_key="weights")
    await group.update_weights_from_disk(build_tiny_model(seed=1), "7")
    after = await client.generate(PROMPT, GREEDY, routing_key="weights")
    assert after.weight_version == "7" and before.weight_version != "7"
    assert after.output_logprobs != pytest.approx(before.output_logprobs, abs=0.05)
    assert all([await e.weight_version() for e in group.engines]) and {await e.weight_version()
                                                                       for e in group.engines} == {"7"}
    await group.update_weights_from_disk(build_tiny_model(seed=0), "8")
    back = await client.generate(PROMPT, GREEDY, routing_key="weights")
    assert back.weight_version == "8"
    assert back.output_ids == before.output_ids
    assert back.output_logprobs == pytest.approx(before.output_logprobs, abs=0.05)


async def _until_serving(engines: list[SGLangEngine], *tasks: asyncio.Future[object], count: int = 1,
                         timeout_s: float = 60) -> None:
    """Returns once ``engines`` together report ``count`` running or waiting requests; fails once fewer
    than ``count`` of the requests are left unfinished."""
    deadline = time.monotonic() + timeout_s
    while (active := sum([await e.active_requests() for e in engines])) < count:
        assert sum(not t.done() for t in tasks) >= count, f"the requests ended before the engines reported {count}"
        assert time.monotonic() < deadline, f"{active} of {count} requests reached {[e.url for e in engines]} " \
                                            f"in {timeout_s} s"
        await asyncio.sleep(0.02)


async def test_weight_update_under_load_with_retract(group: EngineGroup, client: InferenceClient) -> None:
    params = SamplingParams(max_new_tokens=300, ignore_eos=True)
    task = asyncio.ensure_future(client.generate(PROMPT, params, routing_key="mid-update"))
    await _until_serving(group.engines, task)  # not after a fixed delay: on free cores 300 tokens take about a second
    await group.update_weights_from_disk(build_tiny_model(seed=1), "9", pause_mode="retract")
    res = await asyncio.wait_for(task, 120)
    print(f"request across a retract-paused update: {res.finish_reason.kind.value}, spans {res.weight_version_spans}")
    assert res.finish_reason.kind is FinishKind.LENGTH and len(res.output_ids) == 300
    assert res.weight_version == "9"
    spans = res.weight_version_spans
    assert spans and spans[0][1] == 0 and spans[-1][2] == 300 and spans[-1][0] == "9"
    assert all(a[2] == b[1] for a, b in itertools.pairwise(spans))  # contiguous, nothing unaccounted
    await group.update_weights_from_disk(build_tiny_model(seed=0), "10")


async def test_pause_continue_and_flush(group: EngineGroup) -> None:
    engine = group.engines[0]
    async with InferenceClient(ClientConfig(base_url=engine.url)) as direct:
        await engine.pause_generation("retract")
        task = asyncio.ensure_future(direct.generate(PROMPT, SamplingParams(max_new_tokens=4)))
        await asyncio.sleep(1.5)
        assert not task.done()
        await engine.continue_generation()
        res = await asyncio.wait_for(task, 60)
    assert res.finish_reason.kind is FinishKind.LENGTH and len(res.output_ids) == 4
    await engine.flush_cache()


async def test_attach_checks_server_info(group: EngineGroup) -> None:
    engine = group.engines[1]
    assert engine.config is not None
    attached = await SGLangEngine.attach(engine.url, engine.config)
    assert attached.process is None and await attached.healthy()
    with pytest.raises(EngineError, match=r"context_length: engine has 512, expected 1024"):
        await SGLangEngine.attach(engine.url, {"context_length": 1024, "tp_size": 1})


async def test_killed_engine_loses_no_request_and_is_restarted(group: EngineGroup,
                                                               client: InferenceClient) -> None:
    victim = group.engines[0]
    assert victim.process is not None
    old_pid = victim.process.pid
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    tasks = [asyncio.ensure_future(client.generate(PROMPT, params, routing_key=f"kill-{i}")) for i in range(16)]
    await _until_serving([victim], *tasks)  # killed while it serves: on free cores the batch can end within a second
    victim.process.kill_now()
    results = await asyncio.wait_for(asyncio.gather(*tasks), 180)
    completed = [r for r in results if r.finish_reason.kind is FinishKind.LENGTH]
    aborted = [r for r in results if r.aborted]
    print(f"engine killed mid-batch: {len(completed)} completed, {len(aborted)} came back aborted")
    assert len(completed) + len(aborted) == 16
    assert all(len(r.output_ids) == 48 for r in completed)
    assert len(completed) >= 8  # retried on the surviving engine
    # requests really were running on the killed engine: they were retried or came back aborted
    assert aborted or any(r.attempts > 1 for r in completed)
    await group.wait_all_in_rotation(timeout_s=300)
    kinds = [e.kind for e in group.events if e.url == victim.url]
    assert kinds[:3] == ["dead", "removed", "restarted"], group.events
    assert victim.process.pid != old_pid and victim.alive() and victim.restarts == 1
    assert {w["url"] for w in await group.router.workers()} == set(group.engine_urls())
    res = await client.generate(PROMPT, SamplingParams(max_new_tokens=4), routing_key="after-restart")
    assert res.finish_reason.kind is FinishKind.LENGTH

