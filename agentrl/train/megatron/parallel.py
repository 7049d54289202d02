"""Megatron's model-parallel state for the backend, and this rank's place in it.

``torch.distributed`` must be initialised first (by the caller, a launcher or Ray); a single
process without one gets a one-rank group on a free loopback port. :func:`setup_model_parallel`
then creates Megatron's TP/PP/DP (and expert-parallel) groups (or checks that existing ones have the wanted sizes) and
seeds Megatron's RNG tracker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from agentrl.train.device import distributed_backend
from agentrl.train.megatron.config import MegatronBackendConfig

__all__ = ["ParallelLayout", "setup_model_parallel"]


@dataclass(frozen=True)
class ParallelLayout:
    """This rank's coordinates in the TP × PP × DP grid and the process groups it belongs to; ``ep_*``:
    its place among the expert-parallel ranks that share a MoE layer's experts (carved out of the
    data-parallel ranks: they run different micro-batches through the same layers);
    ``expert_dp_rank``: which copy of its experts this rank holds (0: the first)."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    tp_group: Any
    pp_group: Any
    dp_group: Any
    ep_rank: int = 0
    ep_size: int = 1
    ep_group: Any = None
    expert_dp_rank: int = 0

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def reports(self) -> bool:
        """Whether this rank speaks for its replica (last stage, TP rank 0): values summed over the
        world from reporting ranks only count each data-parallel share once."""
        return self.last_stage and self.tp_rank == 0

    @classmethod
    def current(cls) -> ParallelLayout:
        from megatron.core import parallel_state as ps

        return cls(
            tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
            pp_rank=ps.get_pipeline_model_parallel_rank(), pp_size=ps.get_pipeline_model_parallel_world_size(),
            dp_rank=ps.get_data_parallel_rank(), dp_size=ps.get_data_parallel_world_size(),
            tp_group=ps.get_tensor_model_parallel_group(), pp_group=ps.get_pipeline_model_parallel_group(),
            dp_group=ps.get_data_parallel_group(), ep_rank=ps.get_expert_model_parallel_rank(),
            ep_size=ps.get_expert_model_parallel_world_size(), ep_group=ps.get_expert_model_parallel_group(),
            expert_dp_rank=ps.get_expert_data_parallel_rank(),
        )


def setup_model_parallel(config: MegatronBackendConfig, device: torch.device) -> ParallelLayout:
    """Create (or check) Megatron's groups for ``config``'s TP and PP sizes; seed its RNG tracker."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if not dist.is_initialized():
        from torch._C._distributed_c10d import HashStore

        # one process: an in-memory store (no port to pick, so none another process can take first)
        dist.init_process_group(backend=distributed_backend(device), rank=0, world_size=1,
                                store=HashStore())
    world = dist.get_world_size()
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if world % (tp * pp):
        raise ValueError(f"tensor_parallel_size × pipeline_parallel_size = {tp} × {pp}: must divide the "
                         f"world size {world} (the rest is data parallel)")
    ep = config.expert_parallel_size
    if (world // (tp * pp)) % ep:
        raise ValueError(f"expert_parallel_size={ep}: must divide the data-parallel size {world // (tp * pp)} (world "
                         f"{world} / (tensor_parallel_size {tp} × pipeline_parallel_size {pp})): expert-parallel ranks "
                         "are data-parallel ranks that share the experts")
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                ps.get_expert_model_parallel_world_size())
        if have != (tp, pp, ep):
            raise ValueError(f"tensor_parallel_size, pipeline_parallel_size, expert_parallel_size = {(tp, pp, ep)}: "
                             f"megatron's model-parallel state is already initialised with {have}")
    else:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                     expert_model_parallel_size=ep)
    tensor_parallel.model_parallel_cuda_manual_seed(config.seed)
    return ParallelLayout.current()
