"""agentrl.testing.start_ranks: rank processes forked from a forkserver that imported the heavy modules."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from agentrl.testing.ranks import start_ranks


def _report(rank: int, out: str, fail_rank: int) -> None:
    if rank == fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    # what the rank found already imported before it imported anything itself
    (Path(out) / f"{rank}.json").write_text(json.dumps({
        "pid": os.getpid(), "torch": "torch" in sys.modules, "agentrl.train": "agentrl.train" in sys.modules,
        "sys_path_has_tests": str(Path(__file__).parent) in sys.path}))


def test_ranks_run_with_the_heavy_imports_done(tmp_path: Path) -> None:
    ctx = start_ranks(_report, (str(tmp_path), -1), 2)
    while not ctx.join(timeout=60):
        pass
    found = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert found[0]["pid"] != found[1]["pid"] != os.getpid()
    assert all(f["torch"] and f["agentrl.train"] for f in found), found  # preloaded by the forkserver
    assert all(f["sys_path_has_tests"] for f in found)  # the rank function's module was importable


def test_a_failing_rank_is_raised_with_its_error(tmp_path: Path) -> None:
    ctx = start_ranks(_report, (str(tmp_path), 1), 2)
    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        while not ctx.join(timeout=60):
            pass


@pytest.mark.parametrize("nprocs", [0, True, "2"])
def test_bad_process_count_is_refused(nprocs: object) -> None:
    with pytest.raises(ValueError, match=f"nprocs={nprocs!r}"):
        start_ranks(_report, (".", -1), nprocs)  # type: ignore[arg-type]
