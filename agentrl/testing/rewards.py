"""Reward functions that misbehave on purpose, for tests of the reward deadline (tests only).

They are module-level and picklable, so a run sends them to its reward pool's worker processes
like any user reward written at module level.
"""

from __future__ import annotations

from typing import Any

from agentrl.rewards.math import final_answer_text, math_answer_reward

__all__ = ["SpinForever"]


class SpinForever:
    """Scores like ``ToyArithmeticEnv`` except for member ``member`` of the prompt ``question``: there
    it never returns, burning a core (a pathological answer in a CPU-bound checker)."""

    def __init__(self, question: str, member: int = 0) -> None:
        self.question, self.member = question, member

    def __call__(self, trajectory: Any, task: Any) -> float:
        if task.question == self.question and str(trajectory.sample_id).endswith(f":{self.member}"):
            while True:
                pass
        return math_answer_reward(final_answer_text(trajectory.messages), task.answer)
