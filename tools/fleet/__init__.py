"""A sandbox fleet: sandboxes and workspaces executed on a Ray cluster's nodes (``agentrl.tools.fleet``).

The fleet is a *placement* of the existing sandbox and workspace classes: an executor
(:class:`SandboxExecutor`, inside a Ray actor) holds warm sandbox pools and a
:class:`~agentrl.tools.workspace.Workspaces` on one node, and the router (:class:`Fleet`), in the
process that runs the episodes, routes and admits calls to the executors. Tool results, limits,
typed failures and the hostile-input guarantees are those of the local classes.

- :class:`FleetConfig`: the run config's ``[sandbox]`` section (``executor = "local" | "ray"``, the
  Ray resource that marks executor nodes, executors per node, per-executor concurrency, queues and
  deadlines);
- :class:`Fleet`: ``start()``, ``sandbox(backend, limits)``, ``workspaces``, ``take_metrics()``,
  ``close()``; :func:`use_fleet` installs it for this process's tools (``create_sandbox`` and
  ``default_workspaces`` then hand out the fleet's);
- routing: a stateless call goes to any executor with room; a workspace lives on one executor for its
  lifetime, a group's members on the executor holding their prepared state;
- admission: bounded queues per executor; a call that cannot get room before its deadline, or whose
  executor (or node) is lost, raises :class:`ExecutorUnavailableError` / :class:`ExecutorLostError`,
  which end the episode as ``sandbox_unavailable`` / ``executor_lost``: infrastructure failures the
  scheduler regenerates.

See docs/sandbox.md, "A sandbox fleet", for what each node needs and how to start it.
"""

import lazy_loader

# The names are listed in __init__.pyi; each submodule is imported on first use, so the tools that only
# need the fleet's errors (and the run config, its section) do not import Ray's side of it.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
