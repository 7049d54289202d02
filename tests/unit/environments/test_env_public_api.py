"""The public surface of agentrl.environments, agentrl.rewards and the agent loop is pinned."""

from __future__ import annotations

import agentrl.environments
import agentrl.rewards
import agentrl.rollout.agent


def test_public_names_are_pinned_and_resolve() -> None:
    expected = {
        agentrl.environments: ["RETOOL_SYSTEM_PROMPT", "RETOOL_TEMPLATES", "ArithmeticTask", "CheckReport", "EnvGroup",
                               "EnvLimits", "Environment", "EpisodeDoneError", "FailureAction", "FailurePolicy",
                               "MathTask", "RetoolMathEnv", "StepResult", "ToolLike", "ToyArithmeticEnv", "Violation",
                               "check_environment", "make_arithmetic_rows", "make_group", "tool_spec"],
        agentrl.rewards: ["FilterResult", "GroupRewardFn", "MathReward", "Reward", "RewardFn", "RewardPool",
                          "RewardTimeout", "RewardValue", "RewardValueError", "as_reward", "drop_uniform_rewards", "extract_answer_line",
                          "extract_boxed", "final_answer_text", "math_answer_reward", "math_equal", "score",
                          "score_group", "shared_pool"],
        agentrl.rollout.agent: ["AgentConfig", "Episode", "EpisodeRunner", "GenerateClient", "run_episode", "status_for"],
    }
    for module, names in expected.items():
        assert sorted(module.__all__) == sorted(names), module.__name__
        for name in names:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
