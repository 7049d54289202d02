"""Checkpoints and Hugging Face export of the megatron backend.

Checkpoint layout (TP and PP sizes must match on load)::

    megatron_tp{t}_pp{p}.pt   {"model", "optimizer", "step"} of one model-parallel rank (replica 0 writes)
    rng_rank{r}.pt            every rank's RNG state (the torch backend's format)

With expert parallelism (a MoE model, ``expert_parallel_size`` > 1) each expert-parallel rank holds
other experts, so the first replica of each writes its own ``megatron_tp{t}_pp{p}_ep{e}.pt`` (EP
size must match on load too), and export gathers every expert from its rank.

With the distributed optimizer (GPU), optimizer state is sharded over data-parallel ranks; it is
gathered to replica 0 by megatron-core's ``save_parameter_state`` into ``optimizer_tp{t}_pp{p}.pt``.
Export writes one ``model.safetensors`` (in ``export_dtype``) plus the Hugging Face config and
tokenizer from global rank 0. The optimizer state holds Megatron's float32 main weights (with
``bf16``), so a resumed step equals the uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from agentrl.train.checkpoint import capture_rng_state, restore_rng_state, rng_path
from agentrl.train.megatron.schedule import unwrap

if TYPE_CHECKING:
    from agentrl.train.megatron.backend import MegatronTrainBackend

__all__ = ["MegatronCheckpointer"]


class MegatronCheckpointer:
    """Saves, loads and exports one :class:`MegatronTrainBackend` (all methods are collective)."""

    def __init__(self, backend: MegatronTrainBackend) -> None:
        self.backend = backend

    def _shard_file(self, directory: Path, prefix: str = "megatron") -> Path:
        layout = self.backend.layout
        ep = f"_ep{layout.ep_rank}" if layout.ep_size > 1 else ""
        return directory / f"{prefix}_tp{layout.tp_rank}_pp{layout.pp_rank}{ep}.pt"

    def _writes(self) -> bool:
        """Whether this rank writes its shard: the first replica of each model-parallel (and, with
        experts spread over ranks, expert-parallel) rank."""
        layout = self.backend.layout
        return layout.expert_dp_rank == 0 if layout.ep_size > 1 else layout.dp_rank == 0

    def save(self, directory: str | Path) -> Path:
        b = self.backend
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        distributed = b._distributed_optimizer
        if distributed:
            b.optimizer.save_parameter_state(str(self._shard_file(path, "optimizer")))
        if self._writes():
            state = {"model": unwrap(b.model).state_dict(), "step": b.step,
                     "optimizer": b.optimizer.state_dict() if not distributed else None,
                     "tp_size": b.layout.tp_size, "pp_size": b.layout.pp_size, "ep_size": b.layout.ep_size}
            torch.save(state, self._shard_file(path))
        torch.save(capture_rng_state(b.device), rng_path(path, dist.get_rank()))
        dist.barrier()
        return path

    def load(self, directory: str | Path) -> None:
        b = self.backend
        path = Path(directory)
        file = self._shard_file(path)
        if not file.is_file():
            raise FileNotFoundError(f"directory: no {file.name} in {str(path)!r}; not a megatron checkpoint with "
                                    f"tensor_parallel_size={b.layout.tp_size}, pipeline_parallel_size={b.layout.pp_size}"
                                    f", expert_parallel_size={b.layout.ep_size}")
        state = torch.load(file, map_location=b.device, weights_only=True)
        have = (state["tp_size"], state["pp_size"], state.get("ep_size", 1))
        if have != (b.layout.tp_size, b.layout.pp_size, b.layout.ep_size):
            raise ValueError(f"directory: checkpoint has TP, PP, EP = {have}, this backend "
                             f"{(b.layout.tp_size, b.layout.pp_size, b.layout.ep_size)}")
        unwrap(b.model).load_state_dict(state["model"])
        b.optimizer.reload_model_params()  # main (fp32) copies follow the loaded weights
        if state["optimizer"] is not None:
            b.optimizer.load_state_dict(state["optimizer"])
        else:
            b.optimizer.load_parameter_state(str(self._shard_file(path, "optimizer")))
        b.step = int(state["step"])
        rng_file = rng_path(path, dist.get_rank())
        if rng_file.is_file():
            restore_rng_state(torch.load(rng_file, weights_only=False), b.device)
        dist.barrier()

    def export_hf(self, directory: str | Path, *, tokenizer: Any | None = None) -> Path:
        from safetensors.torch import save_file

        b = self.backend
        path = Path(directory)
        tok = tokenizer if tokenizer is not None else b.tokenizer
        if tok is None:
            raise ValueError("export_hf: no tokenizer to write next to the weights; pass tokenizer= or build the "
                             "backend with one (from_pretrained loads the model folder's)")
        tensors: dict[str, torch.Tensor] = {}
        dtype = b.config.export_torch_dtype  # what the engines serve (the run's model.dtype)
        # replica 0 gathers (with experts spread over ranks, every rank takes part); global rank 0 writes
        if b.layout.dp_rank == 0 or b.layout.ep_size > 1:
            for name, tensor in b.named_weights():
                if dist.get_rank() == 0:
                    tensors[name] = tensor.detach().to(device="cpu", dtype=dtype).contiguous()
        if dist.get_rank() == 0:
            path.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
            config = b.hf_config
            if hasattr(config, "save_pretrained"):
                config.dtype = str(dtype).removeprefix("torch.")
                config.save_pretrained(str(path))
            tok.save_pretrained(str(path))
        dist.barrier()
        return path
