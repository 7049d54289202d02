"""Config value checks and the dtypes a TorchBackendConfig names."""

from __future__ import annotations

import pytest
import torch

from agentrl.algorithms import DEFAULT_CHUNK_SIZE, RoutingReplay
from agentrl.train import LossConfig, TorchBackendConfig


def test_backend_config_dtypes() -> None:
    cfg = TorchBackendConfig(dtype="float64")
    assert cfg.torch_dtype is torch.float64 and cfg.autocast_dtype is None
    mixed = TorchBackendConfig(dtype="float32", autocast="bfloat16")
    assert mixed.torch_dtype is torch.float32 and mixed.autocast_dtype is torch.bfloat16
    assert TorchBackendConfig().logprob_chunk_size == DEFAULT_CHUNK_SIZE


def test_kl_loss_type_error_lists_the_kinds() -> None:
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        assert LossConfig(kl_loss_type=kind).kl_loss_type == kind  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kl_loss_type: expected one of 'k1', 'k2', 'k3', 'low_var_kl', got 'k4'"):
        LossConfig(kl_loss_type="k4")  # type: ignore[arg-type]


def test_routing_replay_is_an_enum_whose_error_names_the_field() -> None:
    assert LossConfig().routing_replay is RoutingReplay.OFF
    assert LossConfig(routing_replay="rollout").routing_replay is RoutingReplay.ROLLOUT  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"routing_replay: expected one of \['off', 'rollout'\], got 'always'"):
        LossConfig(routing_replay="always")  # type: ignore[arg-type]
