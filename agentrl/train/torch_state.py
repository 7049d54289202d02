"""Checkpoints and Hugging Face export of the torch backend (:class:`~agentrl.train.TorchTrainBackend`).

Checkpoint layout::

    trainer.pt        {"model", "optimizer", "step", "master" (float32 master weights or None),
                       "sharded" (bool)}, written by rank 0
    rng_rank{r}.pt    every rank's RNG state

A checkpoint holds what the next step reads, so a resumed step equals the uninterrupted one bit for
bit: the model's weights, the float32 master weights of a low-precision model (its weights are
rounded from them), and the optimizer state. Under FSDP the model and optimizer states are
gathered into full (unsharded, name-keyed) states on rank 0 and scattered back on load; the model
is float32 there, so the model state *is* the master weights.

Export writes the weights in ``config.export_torch_dtype`` (the run's ``model.dtype``: what the
engines serve, so an float32 trainer does not write twice the bytes per sync), tied weights once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentrl.train.checkpoint import capture_rng_state, restore_rng_state, rng_path, trainer_path
from agentrl.train.distributed import barrier
from agentrl.train.sharding import full_model_state, full_optimizer_state, load_full_state

if TYPE_CHECKING:
    from agentrl.train.torch_backend import TorchTrainBackend

__all__ = ["cast_state", "export_hf", "load_checkpoint", "save_checkpoint", "tied_names"]


def save_checkpoint(backend: TorchTrainBackend, directory: str | Path) -> Path:
    """Write the model, master weights, optimizer and step (rank 0) and every rank's RNG state."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    if backend.sharded:
        model_state = full_model_state(backend.model)
        optimizer_state = full_optimizer_state(backend.model, backend.optimizer)
    elif backend.dist.rank == 0:
        # LoRA: the adapter only (the frozen base is the model folder's)
        model_state = backend.adapter.state_dict() if backend.adapter is not None else backend.model.state_dict()
        optimizer_state = backend.optimizer.state_dict()
    if backend.dist.rank == 0:
        masters = backend.masters.state_dict() if backend.masters is not None else None
        torch.save({"model": model_state, "optimizer": optimizer_state, "step": backend.step, "master": masters,
                    "sharded": backend.sharded, "lora": backend.adapter is not None}, trainer_path(path))
    torch.save(capture_rng_state(backend.device), rng_path(path, backend.dist.rank))
    barrier()
    return path


def load_checkpoint(backend: TorchTrainBackend, directory: str | Path) -> None:
    """Restore what :func:`save_checkpoint` wrote (every rank reads the rank-0 file)."""
    path = Path(directory)
    if not trainer_path(path).is_file():
        raise FileNotFoundError(f"directory: no trainer.pt in {str(path)!r}; not a checkpoint of this backend")
    state = torch.load(trainer_path(path), map_location="cpu" if backend.sharded else backend.device,
                       weights_only=True)
    if bool(state.get("sharded", False)) != backend.sharded:
        raise ValueError(f"directory: the checkpoint was written with sharded={state.get('sharded', False)}, this "
                         f"backend runs sharded={backend.sharded}; resume with the same train.sharding and ranks")
    if bool(state.get("lora", False)) != (backend.adapter is not None):
        raise ValueError(f"directory: the checkpoint was written {'with' if state.get('lora') else 'without'} "
                         f"train.lora, this backend runs {'with' if backend.adapter is not None else 'without'} it; "
                         "resume with the settings that wrote it")
    if backend.sharded:
        load_full_state(backend.model, backend.optimizer, state["model"], state["optimizer"])
    elif backend.adapter is not None:
        backend.adapter.load_state_dict(state["model"])
        backend.optimizer.load_state_dict(state["optimizer"])
    else:
        backend.model.load_state_dict(state["model"])
        backend.optimizer.load_state_dict(state["optimizer"])
    if backend.masters is not None:
        if state.get("master") is None:
            raise ValueError("directory: the checkpoint has no master weights, this backend keeps float32 master "
                             "weights (master_weights='float32'); resume with the settings that wrote it")
        backend.masters.load_state_dict(state["master"])
    backend.step = int(state["step"])
    rng_file = rng_path(path, backend.dist.rank)
    if rng_file.is_file():
        restore_rng_state(torch.load(rng_file, weights_only=False), backend.device)


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """Each parameter name that is another name's parameter (tied weights), mapped to the first name."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[name] = first[id(param)]
        else:
            first[id(param)] = name
    return tied


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype, tied: dict[str, str] | None = None
               ) -> dict[str, torch.Tensor]:
    """``state`` with floating tensors in ``dtype``, on the host. Tied weights (``tied``: name → the
    name it is tied to; or tensors sharing storage) stay one tensor, so they are written once."""
    cache: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        tensor = tensor.detach()
        if not tensor.is_floating_point():
            out[name] = tensor.cpu()
            continue
        key = (tensor.data_ptr(), int(tensor.storage_offset()), tuple(int(d) for d in tensor.shape))
        if key not in cache:
            cache[key] = tensor.to(device="cpu", dtype=dtype).contiguous()
        out[name] = cache[key]
    for name, target in (tied or {}).items():
        if name in out and target in out:
            out[name] = out[target]
    return out


def export_hf(backend: TorchTrainBackend, directory: str | Path, tokenizer: Any | None = None) -> Path:
    """Save the model in Hugging Face format (config + safetensors in the export dtype) with its
    tokenizer, from rank 0; collective under FSDP (the weights are gathered)."""
    path = Path(directory)
    tok = tokenizer if tokenizer is not None else backend.tokenizer
    if tok is None:
        raise ValueError("export_hf: no tokenizer to write next to the weights; pass tokenizer= or build the "
                         "backend with one (from_pretrained loads the model folder's)")
    save = getattr(backend.model, "save_pretrained", None)
    if save is None:
        raise TypeError("model: export_hf needs a Hugging Face PreTrainedModel (no save_pretrained)")
    dtype = backend.config.export_torch_dtype
    full = full_model_state(backend.model) if backend.sharded else None
    if full is None and backend.adapter is not None:  # LoRA: the base with the adapter merged in
        full = backend.adapter.merged_state()
    if backend.dist.rank == 0:
        tied = {k.replace(".base_layer.", "."): v.replace(".base_layer.", ".")
                for k, v in tied_names(backend.model).items()}
        state = cast_state(full if full is not None else backend.model.state_dict(), dtype, tied)
        save(str(path), state_dict=state, safe_serialization=True)
        _write_config_dtype(path, dtype)
        tok.save_pretrained(str(path))
    barrier()
    return path


def _write_config_dtype(path: Path, dtype: torch.dtype) -> None:
    """transformers records the model's own dtype in ``config.json``; the file holds ``dtype`` weights."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
