"""CPU engine shim: without an accelerator, pinning host memory is a no-op.

SGLang's LoRA layers ask for pinned host memory (``pin_memory=True``), which a CPU-only torch has no
allocator for; its routed-experts capture (``--enable-return-routed-experts``) registers its host
buffer with ``cudaHostRegister`` through ``torch.cuda.cudart()``, which a CPU-only torch cannot
load. Both only serve device transfers, of which a CPU engine has none.

SGLang forces the ``spawn`` start method for its scheduler and detokenizer processes, because a forked
child cannot use a CUDA context its parent created. A CPU engine has no CUDA context, and under ``spawn``
each child imports torch, transformers and SGLang again (~7 CPU-s each on this project's 2-core machine);
forked, they start from the server's imports. So a CPU engine forks, unless
``AGENTRL_SGLANG_START_METHOD`` names another method (``spawn`` restores SGLang's own choice)."""
import functools
import multiprocessing
import os

import torch

if not torch.cuda.is_available():
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    for _name in ("tensor", "empty", "zeros", "ones", "full", "arange", "as_tensor", "empty_like", "zeros_like"):
        _orig = getattr(torch, _name)

        @functools.wraps(_orig)
        def _no_pin(*args, _orig=_orig, **kwargs):
            kwargs.pop("pin_memory", None)
            return _orig(*args, **kwargs)

        setattr(torch, _name, _no_pin)

    class _NoCudaRuntime:
        """``cudaHostRegister``/``cudaHostUnregister`` answer success (0) and do nothing."""

        @staticmethod
        def cudaHostRegister(ptr, size, flags):  # noqa: N802 (CUDA's name)
            return 0

        @staticmethod
        def cudaHostUnregister(ptr):  # noqa: N802
            return 0

        @staticmethod
        def cudaGetErrorString(rc):  # noqa: N802
            return "no CUDA runtime (CPU engine)"

    torch.cuda.cudart = _NoCudaRuntime  # type: ignore[assignment]

    _START_METHOD = os.environ.get("AGENTRL_SGLANG_START_METHOD", "fork")
    if _START_METHOD not in multiprocessing.get_all_start_methods():
        raise RuntimeError(f"AGENTRL_SGLANG_START_METHOD={_START_METHOD!r}: expected one of "
                           f"{multiprocessing.get_all_start_methods()}")
    _set_start_method = multiprocessing.set_start_method

    def _cpu_start_method(method, force=False):
        """SGLang's ``spawn`` becomes ``AGENTRL_SGLANG_START_METHOD`` (default ``fork``): no CUDA here."""
        return _set_start_method(_START_METHOD if method == "spawn" else method, force=force)

    multiprocessing.set_start_method = _cpu_start_method
