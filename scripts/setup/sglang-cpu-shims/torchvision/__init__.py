"""Import-only stand-in for ``torchvision`` on CPU-only machines (SGLang server subprocess only).

The torchvision wheel on the package index is linked against CUDA torch and fails to load next to
CPU torch, yet SGLang's multimodal utilities import it unconditionally. This package answers every
``torchvision.*`` import with a stub module whose attributes are stub classes: they can be used as
base classes and in attribute chains, and raise ``NotImplementedError`` when called.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, NoReturn

__version__ = "0.0.0"


class _StubMeta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"{cls.__qualname__} is a torchvision CPU stub and cannot be used")

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__qualname__}.{name}")


def _stub_class(qualname: str) -> Any:
    stub = _StubMeta(qualname.rsplit(".", 1)[-1], (), {})
    stub.__qualname__ = qualname
    return stub


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__version__ = __version__  # type: ignore[attr-defined]
        module.__path__ = []  # every stub is a package, so any submodule import works
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


if not any(isinstance(finder, _StubFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _StubFinder())


def __getattr__(name: str) -> Any:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _stub_class(f"torchvision.{name}")
