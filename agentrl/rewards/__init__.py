"""Rewards: the :class:`Reward` value, sync/async per-trajectory and per-group reward functions, math answers,
and the group filter over rewards (:func:`drop_uniform_rewards`, :class:`FilterResult`)."""

from agentrl.rewards.filters import FilterResult, drop_uniform_rewards
from agentrl.rewards.math import (
    MathReward,
    extract_answer_line,
    extract_boxed,
    final_answer_text,
    math_answer_reward,
    math_equal,
)
from agentrl.rewards.pool import RewardPool, RewardTimeout, shared_pool
from agentrl.rewards.types import (
    GroupRewardFn,
    Reward,
    RewardFn,
    RewardValue,
    RewardValueError,
    as_reward,
    score,
    score_group,
)

__all__ = [
    "FilterResult",
    "GroupRewardFn",
    "MathReward",
    "Reward",
    "RewardFn",
    "RewardPool",
    "RewardTimeout",
    "RewardValue",
    "RewardValueError",
    "as_reward",
    "drop_uniform_rewards",
    "extract_answer_line",
    "extract_boxed",
    "final_answer_text",
    "math_answer_reward",
    "math_equal",
    "score",
    "score_group",
    "shared_pool",
]
