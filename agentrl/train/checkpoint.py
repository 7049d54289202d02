"""Checkpoint files of the torch backend: model, optimiser, step (rank 0) and RNG state (per rank).

Layout of a checkpoint directory::

    trainer.pt          {"model": state_dict, "optimizer": state_dict, "step": int}   (rank 0)
    rng_rank{r}.pt      {"python", "numpy", "torch", "device"}                        (every rank)

Everything is saved as tensors and plain containers, so loading uses ``torch.load(weights_only=True)``.
Hugging Face export (safetensors + config) for the engines is separate: see ``export_hf``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.train.device import device_module

__all__ = ["capture_rng_state", "restore_rng_state", "rng_path", "trainer_path"]


def trainer_path(directory: str | Path) -> Path:
    return Path(directory) / "trainer.pt"


def rng_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rng_rank{rank}.pt"


def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """Python, NumPy, torch CPU and (if an accelerator) device RNG states, as loadable containers."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    module = device_module(device)
    return {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys).copy()), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "device": module.get_rng_state(device) if module is not None else None,
    }


def restore_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Inverse of :func:`capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    module = device_module(device)
    if module is not None and state.get("device") is not None:
        module.set_rng_state(state["device"], device)
