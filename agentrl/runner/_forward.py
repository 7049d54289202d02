"""The sides' forwarders, written once per transport from the protocols' method names.

The runner drives the two sides through :class:`~agentrl.runner.loop.TrainSide` and
:class:`~agentrl.runner.loop.RolloutSide`; between the runner and the plain objects that do the work
(:class:`~agentrl.runner.trainer.TrainService`, :class:`~agentrl.runner.RolloutService`) sit transports
that hand every method on unchanged: a worker thread, a Ray actor, every rank of a train group. Each
transport is one function ``name -> method`` and :func:`forwards` gives a class one such method per name
of a protocol (:func:`protocol_methods`), so a method added to a protocol reaches every transport.

The methods are real class attributes (Ray builds an actor's methods from its class). A forwarder the
runner holds as a protocol derives from :class:`Forwarded`, which tells the type checker that the
class has them; mypy checks the callers against the protocol they hold.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["Forwarded", "forwards", "protocol_methods"]

C = TypeVar("C", bound=type)


def protocol_methods(protocol: type) -> tuple[str, ...]:
    """The public methods ``protocol`` declares (its own and its bases'), by name."""
    return tuple(name for name in dir(protocol)
                 if not name.startswith("_") and inspect.isfunction(getattr(protocol, name)))


def forwards(names: Iterable[str], make: Callable[[str], Callable[..., Any]]) -> Callable[[C], C]:
    """Class decorator: each of ``names`` the class does not define itself becomes the method
    ``make(name)``."""

    def decorate(cls: C) -> C:
        for name in names:
            if name in vars(cls):
                continue
            method = make(name)
            method.__name__ = name
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, method)
        return cls

    return decorate


class Forwarded:
    """Base of a forwarder the runner holds as a side's protocol: the methods :func:`forwards` writes
    are invisible to a type checker, so for it every other attribute is a method."""

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Callable[..., Any]: ...
