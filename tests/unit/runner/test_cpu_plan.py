"""CPU placement: core splits, the engine environment, pinning a process tree, trainer threads."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
import torch

from agentrl.runner.cpu import CpuPlan, available_cores, plan_cpu

THREADED_TREE = """
import subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", "import threading, time; "
                          "[threading.Thread(target=time.sleep, args=(60,), daemon=True).start() for _ in range(2)]; "
                          "time.sleep(60)"])
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print(child.pid, flush=True)
time.sleep(60)
"""


def test_two_cores_one_engine_is_the_measured_layout() -> None:
    plan = plan_cpu([0, 1], engines=1)
    assert plan.engine_cores == ((0,),) and plan.trainer_cores == (1,) and plan.trainer_threads == 1
    assert plan.engine_env(0) == {"SGLANG_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert not plan.shared


def test_larger_machines_split_in_blocks_and_keep_the_trainer_a_core() -> None:
    plan = plan_cpu(list(range(16)), engines=2)
    assert plan.engine_cores == (tuple(range(4)), tuple(range(4, 8))) and plan.trainer_cores == tuple(range(8, 16))
    assert [e["SGLANG_CPU_OMP_THREADS_BIND"] for e in plan.engine_envs] == ["0-3", "4-7"]
    wide = plan_cpu([0, 1, 2, 3], engines=1, engine_fraction=0.9)
    assert wide.engine_cores == ((0, 1, 2),) and wide.trainer_cores == (3,)
    gaps = plan_cpu([5, 1, 2, 7, 3, 9], engines=1)
    assert gaps.engine_env(0)["SGLANG_CPU_OMP_THREADS_BIND"] == "1-3" and gaps.trainer_cores == (5, 7, 9)


def test_too_few_cores_share_them_and_say_so() -> None:
    plan = plan_cpu([0, 1], engines=3)
    assert plan.shared and plan.engine_cores == ((0,), (1,), (0,)) and plan.trainer_cores == (1,)


def test_core_counts_use_this_process_cores_or_number_another_machine() -> None:
    own = available_cores()
    assert plan_cpu().cores == own and plan_cpu(1).cores == own[:1]
    assert plan_cpu(len(own) + 6).cores == tuple(range(len(own) + 6))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"engines": 0}, r"plan_cpu\(engines=0\): expected an int >= 1"),
    ({"cores": 0}, r"plan_cpu\(cores=0\): expected a core count >= 1"),
    ({"cores": [-1]}, r"expected a non-empty list of core ids >= 0"),
    ({"engine_fraction": 1.0}, r"engine_fraction=1\.0\): expected a value in \(0, 1\)"),
])
def test_bad_arguments_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_cpu(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="engine index 1 out of range; the plan has 1 engines"):
        plan_cpu([0, 1]).engine_env(1)


def test_pin_sets_every_thread_of_the_tree() -> None:
    core = available_cores()[0]
    plan = CpuPlan(cores=(core,), engine_cores=((core,),), trainer_cores=(core,))
    parent = subprocess.Popen([sys.executable, "-c", THREADED_TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 20
        while child.num_threads() < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        tids = [t.id for p in (psutil.Process(parent.pid), child) for t in p.threads()]
        assert plan.pin(0, parent.pid) == len(tids) >= 7
        assert all(os.sched_getaffinity(t) == {core} for t in tids)
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()


def test_apply_trainer_sets_torch_threads() -> None:
    before = torch.get_num_threads()
    try:
        plan_cpu([0, 1, 2, 3], engines=1).apply_trainer()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
