"""Test-only CPU shim for megatron-core (level 2 of the project's reference notes).

megatron-core asks for CUDA unconditionally in a few hundred places (RNG tracker, RoPE buffers,
schedule scalars, the optimizer's bookkeeping). On a CPU-only machine this module remaps those
requests to the CPU *for tests*: it patches ``torch.cuda``'s RNG and device helpers and enters a
process-global ``TorchFunctionMode`` that rewrites CUDA devices to CPU. The library never imports
it; call :func:`install` after ``import torch`` and before building any Megatron model.

It hides CUDA, it does not emulate it: streams and events are synchronous no-ops.

Mixture-of-experts: the all-to-all token dispatcher moves its split sizes to the host with
``maybe_move_tensor_to_cpu(..., as_numpy=True)``, which converts CUDA tensors only; on the CPU the
splits stay tensors and ``all_to_all_single`` refuses them. The shim converts CPU tensors too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["install"]

_INSTALLED: list[TorchFunctionMode] = []


def _to_cpu(device: Any) -> Any:
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"
    return device


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _to_cpu(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _to_cpu(args[1]), *args[2:])
        if func is torch.Tensor.record_stream:
            return None
        return func(*args, **kwargs)


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _Event:
        return _Event()

    def query(self) -> bool:
        return True


class _Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def _patch_cuda() -> None:
    cuda: Any = torch.cuda
    cuda.current_device = lambda: "cpu"
    cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    cuda.manual_seed_all = lambda seed: None  # torch.manual_seed calls it: must not recurse
    cuda.Stream = _Stream
    cuda.Event = _Event
    cuda.current_stream = lambda device=None: _Stream()
    cuda.default_stream = lambda device=None: _Stream()
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.synchronize = lambda device=None: None
    cuda.set_device = lambda device: None
    cuda.device_count = lambda: 1
    cuda.empty_cache = lambda: None
    cuda.memory_allocated = lambda device=None: 0
    cuda.max_memory_allocated = lambda device=None: 0
    cuda.nvtx.range_push = lambda msg: None
    cuda.nvtx.range_pop = lambda: None

    from megatron.core.tensor_parallel import random as mrandom

    def get_state(device: Any = -1, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
        return torch.get_rng_state()

    def set_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
        torch.set_rng_state(new_state)

    mrandom._get_cuda_rng_state = get_state  # type: ignore[assignment]
    mrandom._set_cuda_rng_state = set_state  # type: ignore[assignment]


def _patch_moe_dispatcher() -> None:
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    original = moe_utils.maybe_move_tensor_to_cpu

    def to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy() if as_numpy else tensor
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = to_host  # type: ignore[assignment]
    token_dispatcher.maybe_move_tensor_to_cpu = to_host  # type: ignore[attr-defined]


def install() -> None:
    """Patch ``torch.cuda`` for megatron-core on CPU and enter the CUDA→CPU device mode (once)."""
    if _INSTALLED or torch.cuda.is_available():
        return
    _patch_cuda()
    _patch_moe_dispatcher()
    mode = _CudaToCpu()
    mode.__enter__()
    _INSTALLED.append(mode)
