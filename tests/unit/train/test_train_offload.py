"""agentrl.train.offload: what it finds in an optimizer and that a round trip changes nothing.

On a CPU trainer both directions are no-ops (the state is already in host memory); the moves on a
device are measured by scripts/gpu_check_placement.py on a GPU machine."""

from __future__ import annotations

import torch

from agentrl.train.offload import offload, onload, torch_optimizers


class _Wrapper:
    """Shaped like Megatron's optimizer wrappers: the torch optimizers are inside."""

    def __init__(self, *inner: torch.optim.Optimizer) -> None:
        self.chained_optimizers = [type("Single", (), {"optimizer": opt})() for opt in inner]


def test_the_torch_optimizers_inside_wrappers_are_found() -> None:
    a = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])
    b = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert list(torch_optimizers(a)) == [a]
    assert list(torch_optimizers(_Wrapper(a, b))) == [a, b]
    assert list(torch_optimizers(object())) == []


def test_a_round_trip_on_cpu_frees_nothing_and_changes_nothing() -> None:
    torch.manual_seed(0)
    models = [torch.nn.Linear(8, 8) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    x = torch.randn(4, 8)
    for _ in range(2):
        for m, o in zip(models, opts, strict=True):
            m(x).pow(2).sum().backward()
            o.step()
            o.zero_grad()
        report = offload(models[0].parameters(), opts[0], torch.device("cpu"))
        assert report == {"offload/bytes": 0.0}
        assert onload(opts[0], torch.device("cpu")) == {"onload/bytes": 0.0}
    assert all(torch.equal(p, q) for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True))


def test_master_weights_are_offloaded_with_the_optimizer_state() -> None:
    """A bfloat16 backend's offloadable tensors are its float32 master weights (the optimizer's
    parameters, not the model's): the service hands them to offload/onload with Adam's moments. On
    CPU nothing moves; scripts/gpu_check_train.py moves them on a GPU and checks the next step."""
    from _train_helpers import tiny_model, trajectories

    from agentrl.runner.trainer import TrainService
    from agentrl.train import LossConfig, TorchBackendConfig, TorchTrainBackend, build_training_batch

    backend = TorchTrainBackend(tiny_model(0, dtype=torch.float32), TorchBackendConfig(
        device="cpu", dtype="bfloat16", loss=LossConfig(old_logprobs="recompute")))
    backend.train_step(build_training_batch(trajectories(1, 2, seed=3)))
    assert backend.masters is not None
    assert [id(t) for t in backend.offloadable()] == [id(t) for t in backend.masters.params]
    assert {id(p) for g in backend.optimizer.param_groups for p in g["params"]} == {id(t) for t in backend.masters.params}
    service = TrainService(backend)
    assert service.offload() == {"offload/bytes": 0.0} and service.onload() == {"onload/bytes": 0.0}
