"""Fake SGLang workers (threads of the test process) behind the real sglang-router binary."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from agentrl.rollout import Router, RouterConfig, RouterPolicy
from agentrl.testing.fake_worker import FakeCluster, FakeWorker, FakeWorkerState


@pytest.fixture(scope="module")
def fake_cluster() -> Iterator[FakeCluster]:
    workers = [FakeWorker(FakeWorkerState(name=f"w{i}")) for i in range(2)]
    for w in workers:
        w.start()
    router = asyncio.run(Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING)))
    try:
        for w in workers:
            asyncio.run(router.add_worker(w.url))
        yield FakeCluster(router, workers)
    finally:
        router.stop()
        for w in workers:
            w.stop()


@pytest.fixture
def cluster(fake_cluster: FakeCluster) -> FakeCluster:
    fake_cluster.reset()
    return fake_cluster
