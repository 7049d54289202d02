"""CPU engine shim: SGLang's LoRA layers ask for pinned host memory, which a CPU-only torch has no
allocator for; without an accelerator, pinning is a no-op."""
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
