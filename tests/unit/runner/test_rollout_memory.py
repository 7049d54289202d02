"""RolloutService's colocated memory hand-off against fake workers behind the real router: SGLang's
order (release all; weights back, then the rest), only engines in rotation, nothing resumed twice."""

from __future__ import annotations

from agentrl.rollout import EngineGroup, Router, RouterConfig, SGLangEngine
from agentrl.runner.rollout_service import RolloutService
from agentrl.testing.fake_worker import FakeWorker, FakeWorkerState


def _memory_calls(worker: FakeWorker) -> list[str]:
    return [c for c in worker.state.control_calls if "memory_occupation" in c]


async def test_release_and_resume_reach_the_engines_in_rotation_in_sglangs_order() -> None:
    workers = [FakeWorker(FakeWorkerState(name=f"m{i}")) for i in range(2)]
    for w in workers:
        w.start()
    router = await Router.launch(RouterConfig())
    group = EngineGroup(router, [])
    try:
        for w in workers:
            await group.add_engine(await SGLangEngine.attach(w.url))
        service = RolloutService(scheduler=None, weights=None)  # type: ignore[arg-type]  # memory only
        service.group = group
        await service.resume_memory(["weights"])  # nothing released yet: nothing to resume
        await group.take_out(group.engines[1])    # e.g. dead: it is being restarted
        await service.release_memory()
        await service.release_memory()             # once released, not again
        await service.resume_memory(["weights"])
        await service.resume_memory(None)
        await service.resume_memory(None)
        assert _memory_calls(workers[0]) == ["/release_memory_occupation all",
                                             "/resume_memory_occupation weights",
                                             "/resume_memory_occupation kv_cache,cuda_graph"]
        assert _memory_calls(workers[1]) == []
    finally:
        await group.shutdown()
        for w in workers:
            w.stop()
