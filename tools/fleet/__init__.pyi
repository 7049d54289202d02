"""Type stub: the public names of agentrl.tools.fleet (imported lazily at runtime, see __init__.py)."""

from .admission import Admission, Slot
from .config import EXECUTORS, FleetConfig
from .errors import REASONS, ExecutorLostError, ExecutorUnavailableError
from .executor import ExecutorActor, ExecutorSettings, SandboxExecutor
from .links import ExecutorLink, LocalLink, RayLink
from .placement import current_fleet, install, uninstall, use_fleet
from .remote import FleetSandbox, FleetWorkspaces, RemoteWorkspace
from .router import Fleet, select_nodes

__all__ = [
    "EXECUTORS",
    "REASONS",
    "Admission",
    "ExecutorActor",
    "ExecutorLink",
    "ExecutorLostError",
    "ExecutorSettings",
    "ExecutorUnavailableError",
    "Fleet",
    "FleetConfig",
    "FleetSandbox",
    "FleetWorkspaces",
    "LocalLink",
    "RayLink",
    "RemoteWorkspace",
    "SandboxExecutor",
    "Slot",
    "current_fleet",
    "install",
    "select_nodes",
    "uninstall",
    "use_fleet",
]
