"""CPU engine shim: without an accelerator, pinning host memory is a no-op.

SGLang's LoRA layers ask for pinned host memory (``pin_memory=True``), which a CPU-only torch has no
allocator for; its routed-experts capture (``--enable-return-routed-experts``) registers its host
buffer with ``cudaHostRegister`` through ``torch.cuda.cudart()``, which a CPU-only torch cannot
load. Both only serve device transfers, of which a CPU engine has none."""
import functools

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
