"""Deprecated aliases: a public name that moved keeps working at its old import path for one release,
with a :class:`DeprecationWarning` that names its new home.

The old module sets its ``__getattr__`` from :func:`moved_names`. Python calls a module's
``__getattr__`` only for names the module does not define, so the old module must not bind the moved
names itself (it may import them under ``if TYPE_CHECKING:`` so that type checkers still see them)::

    __getattr__ = moved_names(__name__, {"drop_uniform_rewards": "agentrl.rewards"})

A name that was renamed as it moved is given as ``"module:NewName"``.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping

__all__ = ["moved_names"]


def moved_names(module: str, moved: Mapping[str, str],
                fallback: Callable[[str], object] | None = None) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``module``: each name of ``moved`` (name -> the module it moved to,
    or ``"module:NewName"``) is that object in its new module, handed out with a
    :class:`DeprecationWarning` that points at the importing line. Any other name goes to ``fallback``
    (e.g. a lazy loader's ``__getattr__``), or is an :class:`AttributeError`."""

    def __getattr__(name: str) -> object:
        target = moved.get(name)
        if target is None:
            if fallback is not None:
                return fallback(name)
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, _, new_name = target.partition(":")
        new_name = new_name or name
        warnings.warn(f"{module}.{name} moved to {new}.{new_name}; import it from {new} (the old name is a "
                      "deprecated alias that will be removed in the next release)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), new_name)

    return __getattr__
