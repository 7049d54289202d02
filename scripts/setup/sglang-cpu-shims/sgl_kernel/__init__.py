"""Import-only stand-in for ``sgl_kernel`` on CPU-only machines (SGLang server subprocess only).

SGLang's CPU path imports a few kernels from ``sgl_kernel`` at module level. With the ``torch_native``
attention backend none of them runs; if one ever does, it raises ``NotImplementedError`` naming it.
"""

from __future__ import annotations

from typing import Any, NoReturn

__version__ = "0.0.0"


def _missing(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available: this is the CPU stub of sgl_kernel, "
            "install the real sgl-kernel (GPU) to use this code path"
        )

    kernel.__name__ = name
    kernel.__qualname__ = name
    return kernel


def __getattr__(name: str) -> Any:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _missing(name)
