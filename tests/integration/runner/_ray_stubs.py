"""Plain classes the Ray tests wrap as actors (they only ask Ray which node they run on).

The module is pickled by value, so Ray workers need not import it from the tests folder.
"""

from __future__ import annotations

import asyncio
import os
import sys

import ray
import torch
import torch.distributed as dist

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Counter:
    """A counter with a sync and an async side."""

    def __init__(self, start: int = 0) -> None:
        self.value = start
        self._arrived = 0
        self._all_in: asyncio.Event | None = None

    def add(self, n: int = 1) -> int:
        self.value += n
        return self.value

    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    def cwd(self) -> str:
        return os.getcwd()

    def where(self) -> dict[str, object]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}

    async def meet(self, n: int) -> int:
        """Returns only once ``n`` calls are inside at the same time (so it needs concurrency >= n)."""
        if self._all_in is None:
            self._all_in = asyncio.Event()
        self._arrived += 1
        if self._arrived >= n:
            self._all_in.set()
        await self._all_in.wait()
        return self._arrived


class DistStub:
    """Built after the process group: checks it, all-reduces, fails on demand."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def info(self) -> dict[str, object]:
        return {"tag": self.tag, "rank": self.rank, "world_size": self.world_size,
                "backend": dist.get_backend(), "threads": torch.get_num_threads()}

    def all_reduce(self, values: list[float]) -> list[float]:
        tensor = torch.tensor([values[self.rank]], dtype=torch.float64)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} fails on purpose")
        return self.rank

    async def async_rank(self) -> int:
        await asyncio.sleep(0)
        return self.rank


class TinyTrainer:
    """One real optimiser step of the torch backend on the tiny Qwen3 (float32, CPU)."""

    def __init__(self, model_path: str) -> None:
        from agentrl.train import LossConfig, OptimizerConfig, TorchBackendConfig, TorchTrainBackend

        torch.manual_seed(0)
        config = TorchBackendConfig(device="cpu", dtype="float32", loss=LossConfig(old_logprobs="recompute"),
                                    optimizer=OptimizerConfig(lr=1e-2))
        self.backend = TorchTrainBackend.from_pretrained(model_path, config)

    def where(self) -> dict[str, object]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}

    def train_step(self, seed: int) -> dict[str, float]:
        import random
        import time

        from agentrl.train import build_training_batch
        from agentrl.trajectory import Status, Trajectory

        rng = random.Random(seed)
        vocab = self.backend.vocab_rows
        trajectories = []
        for k in range(4):  # one group of four, rewards 0..3: non-zero advantages
            tr = Trajectory.from_prompt([rng.randrange(vocab) for _ in range(6)], group_id="g0",
                                        rollout_id=f"r{k}")
            tr.append_model([rng.randrange(vocab) for _ in range(8)], [-1.0] * 8)
            tr.finish(Status.COMPLETED)
            tr.reward = float(k)
            trajectories.append(tr)
        before = [p.detach().clone() for p in self.backend.model.parameters()]
        t0 = time.perf_counter()
        metrics = self.backend.train_step(build_training_batch(trajectories))
        elapsed = time.perf_counter() - t0
        moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(self.backend.model.parameters(), before,
                                                                          strict=True))
        return {"loss": float(metrics["loss"]), "param_abs_change": moved, "step_s": elapsed}


class RecordingRank:
    """Stands in for a trainer rank (``TrainRank(config, threads)``): builds nothing, reports what the
    rank's process was given (the placement tests run it where a GPU trainer would run)."""

    def __init__(self, config: dict[str, object], threads: int | None = None) -> None:
        self.threads = threads

    def env(self) -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")}

    def write_marker(self, path: str, token: str) -> str:
        from agentrl.runner.ray_run import TrainRank

        return TrainRank.write_marker(self, path, token)  # type: ignore[arg-type]

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


def _blind_host_class() -> type:
    from agentrl.runner.engine_host import EngineHost

    class BlindHost(EngineHost):
        """An engine host on a node that does not see the trainer's files (stands for a second host
        without a shared filesystem: both fake nodes of the test cluster share one disk)."""

        def reads(self, path: str, token: str) -> bool:
            return False

    return BlindHost


BlindHost = _blind_host_class()
