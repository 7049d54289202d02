"""Run by test_warmup_megatron.py in its own process: the ``warmup`` section on the megatron backend
(world size 1, gloo, megatron-core's CPU shim). Prints one JSON line with what the test checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))  # the megatron CPU shim
import _megatron_cpu

_megatron_cpu.install()



def main(root: Path) -> None:
    from agentrl.environments import make_arithmetic_rows  # after the shim is installed
    from agentrl.runner.config import RunConfig
    from agentrl.runner.trainer import TrainService
    from agentrl.sft import arithmetic_conversations
    from agentrl.testing.runner import fake_run_config
    from agentrl.train import init_process_group
    from agentrl.train.distributed import host_tcp_store

    root.mkdir(parents=True, exist_ok=True)
    data = root / "sft.jsonl"
    rows = make_arithmetic_rows(8, seed=1)
    data.write_text("".join(json.dumps(c) + "\n" for c in arithmetic_conversations(rows, seed=1)))
    base = fake_run_config(root, steps=1, rows=8, checkpoint_every=None).to_dict()
    base["train"]["backend"] = "megatron"  # on a CPU machine: device cpu (cluster.accelerator)
    base["warmup"] = {"data": str(data), "steps": 3, "batch_size": 4, "log_every": 1}
    config = RunConfig.from_dict(base)
    store = host_tcp_store(1, timeout_s=120)  # held here: no port to find free and lose
    torch.set_num_threads(1)
    init_process_group(0, 1, store.port, torch.device("cpu"), timeout_s=120, hosted=True)
    try:
        service = TrainService.from_config(config, threads=1)
        run = root / "run"
        run.mkdir(exist_ok=True)
        report = service.warmup(str(run))
        optimizer = service.backend.optimizer
        states = [len(inner.state) for inner in getattr(optimizer, "chained_optimizers", [optimizer])]
        print(json.dumps({"report": report, "optimizer": type(optimizer).__name__, "states": states,
                          "step": service.backend.step}))
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
