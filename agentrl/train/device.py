"""Device selection for the train backends: CUDA GPUs, Ascend NPUs (``torch_npu``) or CPU.

The library never names ``"cuda"`` directly: a device is chosen by config (``"auto"``, ``"cpu"``,
``"cuda"``, ``"cuda:1"``, ``"npu"``, ``"npu:0"``) and everything device-specific (the
``torch.distributed`` backend, RNG state, synchronisation, memory statistics) goes through
:func:`device_module`. So the CPU tests run the same code path as GPU and NPU runs.

``torch_npu`` is an optional extra (``pip install agentrl[npu]``) and is imported only when an NPU
is selected, or by ``"auto"`` when the package is installed and no CUDA device is present.

Example::

    device = resolve_device("auto")               # cuda if present, else npu if installed, else cpu
    backend = distributed_backend(device)         # "nccl" / "hccl" / "gloo"
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import torch

__all__ = ["device_module", "distributed_backend", "resolve_device"]

_KNOWN = ("cpu", "cuda", "npu")
_DIST_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


def _import_torch_npu() -> ModuleType:
    try:
        return importlib.import_module("torch_npu")
    except ImportError as err:
        raise RuntimeError(
            "device: 'npu' was selected but the optional package torch_npu is not installed "
            "(install the Ascend build of torch-npu matching torch, e.g. `pip install agentrl[npu]`)"
        ) from err


def _accelerator_available(kind: str) -> bool:
    if kind == "cpu":
        return True
    module = getattr(torch, kind, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """Turn a device spec into a ``torch.device``, checking the device exists.

    ``"auto"`` picks the first available of CUDA, NPU (only if ``torch_npu`` is installed), CPU.
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    text = spec.strip().lower()
    if text == "auto":
        if _accelerator_available("cuda"):
            return torch.device("cuda", torch.cuda.current_device())
        if importlib.util.find_spec("torch_npu") is not None:
            _import_torch_npu()
            if _accelerator_available("npu"):
                return torch.device("npu", 0)
        return torch.device("cpu")
    kind = text.split(":", 1)[0]
    if kind not in _KNOWN:
        raise ValueError(f"device: expected 'auto' or one of {list(_KNOWN)} (optionally ':<index>'), got {spec!r}")
    if kind == "npu":
        _import_torch_npu()
    if not _accelerator_available(kind):
        raise RuntimeError(f"device: {spec!r} was selected but no {kind} device is available on this machine")
    try:
        return torch.device(text)
    except RuntimeError as err:
        raise ValueError(f"device: could not parse {spec!r} ({err})") from err


def distributed_backend(device: torch.device) -> str:
    """The ``torch.distributed`` backend for a device: gloo (CPU), NCCL (CUDA), HCCL (Ascend)."""
    try:
        return _DIST_BACKENDS[device.type]
    except KeyError:
        raise ValueError(f"device: no distributed backend known for device type {device.type!r}") from None


def device_module(device: torch.device) -> ModuleType | None:
    """``torch.cuda`` / ``torch.npu`` for accelerators, None for CPU (callers branch on None)."""
    if device.type == "cpu":
        return None
    if device.type == "npu":
        _import_torch_npu()
    module: ModuleType = getattr(torch, device.type)
    return module
