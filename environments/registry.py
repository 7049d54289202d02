"""Names a run config can use for environments, rewards and group filters.

Three sources, in this order:

1. **built-ins** by short name: environments ``toy_arithmetic``, ``retool_math``, ``long_recall`` and ``long_key``; the group
   filter ``drop_uniform_rewards``;
2. **installed packages**, through the entry-point groups ``agentrl.environments``,
   ``agentrl.rewards`` and ``agentrl.group_filters``. A package makes its environment nameable with::

       # pyproject.toml of my-env
       [project.entry-points."agentrl.environments"]
       my-env = "my_env.env:MyEnv"

   after which ``pip install my-env`` lets a config say ``environment.name = "my-env"``;
3. **user code** as ``module:attr`` (imported with the current directory on ``sys.path``), only
   where the caller allows it (``allow_import=True``: the command line does; the Python API takes
   the objects themselves).

An environment name may also stand for an agent harness (:class:`agentrl.proxy.Agent`: ``async def
run(task, client)`` written against the OpenAI client, plus a reward), named exactly like an
environment (``module:attr`` or an entry point): it is a ``row -> episode`` factory too. A bare
``run`` function is refused with the hint to wrap it in ``Agent(run, reward)``.

A built-in name wins over an installed one of the same name. An unknown name raises
:class:`RegistryError` listing every valid name. Nothing is imported until a name is resolved, and
only the entry point asked for is loaded.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ENTRY_POINT_GROUPS", "Kind", "RegistryError", "available", "resolve"]

Kind = Literal["environment", "reward", "group_filter"]

ENTRY_POINT_GROUPS: dict[Kind, str] = {"environment": "agentrl.environments", "reward": "agentrl.rewards",
                                      "group_filter": "agentrl.group_filters"}
"""The entry-point group an installed package registers each kind of component under."""


def _toy() -> Any:
    from agentrl.environments.arithmetic import ToyArithmeticEnv

    return ToyArithmeticEnv


def _retool() -> Any:
    from agentrl.environments.retool import RetoolMathEnv

    return RetoolMathEnv


def _long_recall() -> Any:
    from agentrl.environments.long_recall import LongRecallEnv

    return LongRecallEnv


def _long_key() -> Any:
    from agentrl.environments.long_key import LongKeyEnv

    return LongKeyEnv


def _uniform() -> Any:
    from agentrl.rewards.filters import drop_uniform_rewards

    return drop_uniform_rewards


_BUILTINS: dict[Kind, dict[str, Callable[[], Any]]] = {
    "environment": {"toy_arithmetic": _toy, "retool_math": _retool, "long_recall": _long_recall,
                    "long_key": _long_key},
    "reward": {},
    "group_filter": {"drop_uniform_rewards": _uniform},
}


class RegistryError(ValueError):
    """A name that resolves to nothing usable; the message lists the valid names."""


@dataclass(frozen=True)
class _Found:
    source: str  # "built-in", "package <dist>" or "module"
    obj: Any


def _entry_points(kind: Kind) -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS[kind])}


def available(kind: Kind) -> dict[str, str]:
    """Every name of ``kind`` -> where it comes from (``built-in`` or ``package <name>``)."""
    out = {name: "built-in" for name in _BUILTINS[kind]}
    for name, ep in _entry_points(kind).items():
        if name not in out:
            dist = ep.dist.name if ep.dist is not None else "?"
            out[name] = f"package {dist}"
    return out


def _import(target: str, kind: Kind) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise RegistryError(f"{kind} {target!r}: expected 'module:attr', e.g. 'my_envs.math:MathEnv'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = _did_you_mean(str(exc.name or ""), _sibling_modules(str(exc.name or "")))
        raise RegistryError(f"{kind} {target!r}: cannot import module {module_name!r} ({exc}){hint}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise RegistryError(f"{kind} {target!r}: module {module_name!r} has no attribute {attr!r}"
                                f"{_did_you_mean(part, names)}")
        obj = getattr(obj, part)
    return obj


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=2, cutoff=0.6) if name else []
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _sibling_modules(missing: str) -> list[str]:
    """Importable names where ``missing`` (a dotted module name) was looked for: the other modules of
    its package, or, for a top-level name, the modules and packages of the current directory."""
    parent, _, leaf = missing.rpartition(".")
    if parent:
        try:
            paths = list(getattr(importlib.import_module(parent), "__path__", []))
        except ImportError:
            return []
        return [f"{parent}.{m.name}" for m in pkgutil.iter_modules(paths)]
    return [m.name for m in pkgutil.iter_modules([os.getcwd()])] if leaf else []


def _unknown(kind: Kind, name: str, allow_import: bool) -> RegistryError:
    names = available(kind)
    close = difflib.get_close_matches(name, list(names), n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    listed = ", ".join(f"{n} ({src})" for n, src in sorted(names.items())) or "none"
    extra = ", or 'module:attr' for your own code" if allow_import else ""
    group = ENTRY_POINT_GROUPS[kind]
    return RegistryError(f"unknown {kind} {name!r}{hint}; expected one of: {listed}{extra} (installed packages "
                         f"add names through the entry-point group {group!r})")


def resolve(kind: Kind, name: str, *, allow_import: bool = False) -> Any:
    """The object ``name`` stands for (see the module doc); ``RegistryError`` when there is none."""
    if kind not in _BUILTINS:
        raise RegistryError(f"kind {kind!r}: expected one of {sorted(_BUILTINS)}")
    found = _find(kind, name, allow_import)
    obj = found.obj
    if kind == "environment":
        from agentrl.environments.base import Environment

        if _looks_like_agent_run(obj):
            raise RegistryError(f"environment {name!r} ({found.source}): {obj!r:.80} looks like an agent harness "
                                "run(task, client); expected it wrapped: agent = agentrl.proxy.Agent(run, reward), "
                                "and that object named")
        if not (isinstance(obj, type) and issubclass(obj, Environment)) and not callable(obj):
            raise RegistryError(f"environment {name!r} ({found.source}): expected an Environment subclass or a "
                                f"callable row -> environment, got {obj!r:.100}")
    elif not callable(obj):
        raise RegistryError(f"{kind} {name!r} ({found.source}): expected a callable, got {obj!r:.100}")
    return obj


def _looks_like_agent_run(obj: Any) -> bool:
    """An ``async def`` function, or one taking a ``client``: an agent's ``run``, not a ``row -> environment``
    factory (which builds the environment synchronously from the row alone)."""
    if isinstance(obj, type) or not inspect.isfunction(obj):
        return False
    return inspect.iscoroutinefunction(obj) or "client" in inspect.signature(obj).parameters


def _find(kind: Kind, name: str, allow_import: bool) -> _Found:
    builtin = _BUILTINS[kind].get(name)
    if builtin is not None:
        return _Found("built-in", builtin())
    ep = _entry_points(kind).get(name)
    if ep is not None:
        dist = ep.dist.name if ep.dist is not None else "?"
        try:
            return _Found(f"package {dist}", ep.load())
        except Exception as exc:  # a broken package: say which and why, do not crash the caller
            raise RegistryError(f"{kind} {name!r} (entry point {ep.value!r} of package {dist}): cannot load it "
                                f"({type(exc).__name__}: {exc})") from None
    if ":" in name and allow_import:
        return _Found("module", _import(name, kind))
    if ":" in name:
        raise RegistryError(f"{kind} {name!r}: 'module:attr' names are taken on the command line only; from "
                            f"Python pass the object itself (e.g. environment=MyEnv)")
    raise _unknown(kind, name, allow_import)
