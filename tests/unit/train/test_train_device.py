"""Device selection: explicit and detected devices, distributed backends, optional torch_npu."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import agentrl.algorithms
import agentrl.train
from agentrl.train import device_module, distributed_backend, resolve_device


def test_cpu_and_auto() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    auto = resolve_device("auto")
    if torch.cuda.is_available():
        assert auto.type == "cuda"
    elif importlib.util.find_spec("torch_npu") is None:
        assert auto == torch.device("cpu")
    assert device_module(torch.device("cpu")) is None


def test_backends_per_device_type() -> None:
    assert distributed_backend(torch.device("cpu")) == "gloo"
    assert distributed_backend(torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ValueError, match="no distributed backend known for device type 'meta'"):
        distributed_backend(torch.device("meta"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_missing_cuda_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"device: 'cuda:0' was selected but no cuda device is available"):
        resolve_device("cuda:0")


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed")
def test_npu_without_torch_npu_names_the_extra() -> None:
    with pytest.raises(RuntimeError, match=r"optional package torch_npu is not installed"):
        resolve_device("npu")


def test_unknown_device_spec() -> None:
    with pytest.raises(ValueError, match=r"device: expected 'auto' or one of \['cpu', 'cuda', 'npu'\].*'tpu:0'"):
        resolve_device("tpu:0")


def test_public_surface_is_pinned() -> None:
    for module in (agentrl.algorithms, agentrl.train):
        assert sorted(module.__all__) == sorted(set(module.__all__))
        for name in module.__all__:
            assert getattr(module, name) is not None, name
    assert {"group_advantages", "kl", "ppo_clip_loss", "gspo_loss", "cispo_loss", "tis_weights", "mis_weights",
            "reduce_loss", "logprobs_from_logits", "entropy_from_logits"} <= set(agentrl.algorithms.__all__)
    assert {"TorchTrainBackend", "build_training_batch", "plan_micro_batches"} <= set(agentrl.train.__all__)


def test_a_hosted_store_holds_its_port_from_the_start() -> None:
    """The group's store binds the port the OS picks as it is created: no window in which another
    process can take a port found free (the EADDRINUSE a train group once failed with)."""
    import errno
    import socket
    from datetime import timedelta

    from torch._C._distributed_c10d import TCPStore

    from agentrl.train.distributed import host_tcp_store

    store = host_tcp_store(2, timeout_s=10)
    assert store.port > 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError) as taken:
        other.bind(("127.0.0.1", store.port))
    assert taken.value.errno == errno.EADDRINUSE
    peer = TCPStore("127.0.0.1", store.port, 2, is_master=False, timeout=timedelta(seconds=10))
    peer.set("rank1", "joined")
    assert store.get("rank1") == b"joined"
