"""Which sandbox fleet this process's tools use: the placement of the sandbox and workspace classes.

While a :class:`~agentrl.tools.fleet.router.Fleet` is installed (:func:`use_fleet`, a context manager,
or :func:`install` / :func:`uninstall`), :func:`~agentrl.tools.sandbox.create_sandbox` hands out the
fleet's sandboxes (every backend but ``local``, which stays in this process by definition) and
:func:`~agentrl.tools.workspace.default_workspaces` the fleet's workspaces; so an environment, and
the built-in tools, run on the fleet without a change. The runner installs its fleet for the rollout
side's lifetime (``sandbox.executor = "ray"``); nothing is installed otherwise. One fleet at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.tools.fleet.router import Fleet

__all__ = ["current_fleet", "install", "uninstall", "use_fleet"]

_FLEET: Fleet | None = None


def current_fleet() -> Fleet | None:
    """The installed fleet, if any."""
    return _FLEET


def install(fleet: Fleet) -> None:
    """Makes ``fleet`` the one this process's tools use; raises if another one is installed."""
    global _FLEET
    if _FLEET is not None and _FLEET is not fleet:
        raise RuntimeError("install: another sandbox fleet is installed in this process; uninstall it first")
    _FLEET = fleet


def uninstall(fleet: Fleet) -> None:
    """Removes ``fleet`` (nothing when it is not the installed one)."""
    global _FLEET
    if _FLEET is fleet:
        _FLEET = None


@contextlib.contextmanager
def use_fleet(fleet: Fleet) -> Iterator[Fleet]:
    """``fleet`` installed for the duration of the block."""
    install(fleet)
    try:
        yield fleet
    finally:
        uninstall(fleet)
