"""Shared pytest fixtures for agentrl's tests."""

import os
from typing import Any

import pytest

from agentrl.testing import build_tokenizer


@pytest.fixture(scope="session")
def tok() -> Any:
    """The local test tokenizer (built once, cached on disk), shared by every test that needs one."""
    return build_tokenizer()


# --- running the suite on several workers (pytest-xdist; `make test` runs `-n 2 --dist loadgroup`) ---------
# A module's tests stay on one worker (its module-scoped fixtures are built once), and every module that uses
# one of these session-scoped fixtures joins that fixture's group: one Docker daemon, one Ray cluster per run.
SHARED_SESSION_FIXTURES = {"docker_daemon": "docker", "ray_two_hosts": "ray"}


# Each xdist worker gets its share of the cores for torch's intra-op threads, and so do the processes it starts
# (engines, CLI runs, Ray's workers inherit the variable): two workers on two cores each running torch with two
# OpenMP threads made four busy-waiting threads fight for two cores (tests/unit/train: 113 s -> 83 s with one
# thread each, CPU time 218 s -> 159 s). A test or a run plan that sets its own thread count still does.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config: pytest.Config) -> None:
    # whichever test starts this process's forkserver first (a reward pool, a gloo launch), it imports the
    # heavy modules once for every rank forked from it (agentrl.testing.ranks)
    from agentrl.testing.ranks import preload_forkserver

    preload_forkserver()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not hasattr(config, "workerinput") or workers < 2:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(tryfirst=True)  # before xdist turns the groups into node id suffixes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") == "no":
        return  # one process: nothing to group
    group_of: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        for fixture, group in SHARED_SESSION_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                group_of[module] = group
        group_of.setdefault(module, module)
    slow = {group_of[item.nodeid.split("::", 1)[0]] for item in items if item.get_closest_marker("slow")}
    # slow groups first: the workers start on the long work and the short modules fill in at the end
    items.sort(key=lambda item: group_of[item.nodeid.split("::", 1)[0]] not in slow)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of[item.nodeid.split("::", 1)[0]]))


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Stops a run whose groups did not take (on the controller, once a worker has collected): xdist would
    spread a module's tests over both workers, and every module-scoped engine, Megatron launch and Ray
    cluster would start on each (the suite ran ~1.3x longer, silently, under pytest 9.2)."""
    if node.config.getvalue("dist") != "loadgroup" or not ids or any("@" in i for i in ids):
        return
    import xdist

    pytest.exit(f"pytest-xdist {xdist.__version__} did not put the tests in their --dist loadgroup groups under pytest "
                f"{pytest.__version__} (no '@group' suffix on any node id, e.g. {ids[0]}); expected the versions "
                "pyproject.toml's dev extras pin (pytest < 9.2). `make test WORKERS=0` runs in one process", returncode=4)
