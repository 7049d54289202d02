"""Every enum a user can spell in a config or on a command line refuses a typo by listing the valid values."""

from __future__ import annotations

import pytest

from agentrl import SegmentKind, Status, StopReason
from agentrl.algorithms import AdvantageEstimator, LossAggregation, PolicyLossKind
from agentrl.chat import FailureKind
from agentrl.environments import FailureAction, FailurePolicy
from agentrl.rollout import AbortCause, FinishKind, RouterConfig, RouterPolicy
from agentrl.train import BatchingConfig

ENUMS = [SegmentKind, Status, StopReason, AdvantageEstimator, LossAggregation, PolicyLossKind, FailureKind,
         FailureAction, AbortCause, FinishKind, RouterPolicy]


@pytest.mark.parametrize("enum", ENUMS, ids=lambda e: e.__name__)
def test_an_unknown_value_lists_the_valid_ones(enum: type) -> None:
    with pytest.raises(ValueError) as info:
        enum("no-such-value")
    message = str(info.value)
    assert message.startswith(f"'no-such-value' is not a valid {enum.__name__}; expected one of ")
    assert all(repr(member.value) in message for member in enum)  # type: ignore[attr-defined]


def test_configs_pass_the_list_on() -> None:
    with pytest.raises(ValueError, match="'grop' is not a valid AdvantageEstimator; expected one of 'grpo', 'dr_grpo'"):
        BatchingConfig(estimator="grop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'rr' is not a valid RouterPolicy; expected one of .*'round_robin'"):
        RouterConfig(policy="rr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"overrides.*'panic'"):
        FailurePolicy(overrides={"malformed_json": "panic"})
