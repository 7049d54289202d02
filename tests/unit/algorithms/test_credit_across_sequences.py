"""Credit across the sequences of one rollout (a long episode compacted into several sequences), with
numbers worked out by hand: every sequence gets the rollout's advantage, the group counts the rollout
once, and ``rollout_token_mean`` weighs each trainable token of a rollout by 1 / (its trainable tokens
over all sequences), whatever the packing. docs/training.md, "Credit across sequences", states the rule."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms import group_advantages, ppo_clip_loss, reduce_loss, rollout_denominators
from agentrl.chat import ChatTemplate
from agentrl.environments.long_recall import LongRecallEnv, make_recall_rows, recall_policy
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.context import Summarize
from agentrl.rollout.types import SamplingParams
from agentrl.testing.policy import FakePolicyClient
from agentrl.train import build_training_batch

D = torch.float64
# One group, two rollouts. A: compacted twice, so three sequences with 4, 2 and 3 trainable tokens
# (D_A = 9). B: one sequence of 3 trainable tokens (D_B = 3). A scored 1, B 0.
ROLLOUTS = ["A", "A", "A", "B"]
MASKS = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
LOSSES = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [0.0, 0.0, 9.0, 0.0], [3.0, 3.0, 3.0, 0.0]]


def test_every_sequence_of_a_rollout_gets_its_advantage_and_the_group_counts_it_once() -> None:
    adv = group_advantages([1.0, 1.0, 1.0, 0.0], ["g"] * 4, rollout_ids=ROLLOUTS)
    # per rollout: rewards (1, 0), mean 1/2, unbiased std sqrt(2 * (1/2)^2 / 1) = 1/sqrt(2)
    # -> A: (1 - 1/2) * sqrt(2) = 1/sqrt(2), B: -1/sqrt(2), on every sequence
    assert adv.tolist() == pytest.approx([1 / math.sqrt(2)] * 3 + [-1 / math.sqrt(2)], abs=1e-6)
    # counted per sequence instead, A would weigh three times: mean 3/4, std 1/2 -> A +0.5, B -1.5
    wrong = group_advantages([1.0, 1.0, 1.0, 0.0], ["g"] * 4)
    assert wrong.tolist() == pytest.approx([0.5, 0.5, 0.5, -1.5], abs=1e-5)
    no_std = group_advantages([1.0, 1.0, 1.0, 0.0], ["g"] * 4, rollout_ids=ROLLOUTS, std_normalize=False)
    assert no_std.tolist() == [0.5, 0.5, 0.5, -0.5]


def test_rollout_token_mean_divides_by_the_rollouts_tokens_over_all_its_sequences() -> None:
    assert rollout_denominators(MASKS, ROLLOUTS) == [9.0, 9.0, 9.0, 3.0]
    loss = torch.tensor(LOSSES, dtype=D, requires_grad=True)
    mask = torch.tensor(MASKS)
    den = torch.tensor(rollout_denominators(MASKS, ROLLOUTS), dtype=D)
    out = reduce_loss(loss, mask, den)
    # A: (1+2+3+4 + 5+6 + 9) / 9 = 30/9; B: (3+3+3) / 3 = 3; J = (30/9 + 3) / 2 = 19/6
    assert float(out.detach()) == pytest.approx(19 / 6, abs=1e-12)
    out.backward()
    assert loss.grad is not None
    # each trainable token of A weighs 1 / (B * D_A) = 1/18 in whichever sequence it is; of B 1/6
    expected = [[1 / 18] * 4, [1 / 18, 1 / 18, 0, 0], [1 / 18, 1 / 18, 1 / 18, 0], [1 / 6, 1 / 6, 1 / 6, 0]]
    assert loss.grad.flatten().tolist() == pytest.approx([w for row in expected for w in row], abs=1e-12)
    # one sequence per micro-batch, with the step's rollout count: the same objective
    parts = sum(float(reduce_loss(loss[i:i + 1].detach(), mask[i:i + 1], den[i:i + 1], num_rollouts=2))
                for i in range(4))
    assert parts == pytest.approx(19 / 6, abs=1e-12)


def test_a_masked_summary_reweights_the_rest_of_its_rollout() -> None:
    # the masked-summary control: A's first sequence ends with a 2-token summary, masked out -> D_A = 7
    masks = [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    den = torch.tensor(rollout_denominators(masks, ROLLOUTS), dtype=D)
    assert den.tolist() == [7.0, 7.0, 7.0, 3.0]
    out = reduce_loss(torch.tensor(LOSSES, dtype=D), torch.tensor(masks), den)
    # A: (1+2 + 5+6 + 9) / 7 = 23/7; B: 3; J = (23/7 + 3) / 2 = 22/7
    assert float(out) == pytest.approx(22 / 7, abs=1e-12)


def test_the_policy_gradient_of_a_compacted_rollout_is_its_advantage_spread_over_its_tokens() -> None:
    # ratio 1 (on-policy): the PPO loss is -A per token; with A = 1/sqrt(2) on A's 9 tokens and
    # -1/sqrt(2) on B's 3, J = (-A_A * 9/9 + A_A * 3/3) / 2 = 0 and dJ/dlogp = -A/(2 D) per token
    logp = torch.zeros(4, 4, dtype=D, requires_grad=True)
    adv = group_advantages([1.0, 1.0, 1.0, 0.0], ["g"] * 4, rollout_ids=ROLLOUTS)[:, None].expand(4, 4)
    per_token, _ = ppo_clip_loss(logp, torch.zeros(4, 4, dtype=D), adv, eps_clip=0.2)
    den = torch.tensor(rollout_denominators(MASKS, ROLLOUTS), dtype=D)
    out = reduce_loss(per_token, torch.tensor(MASKS), den)
    assert float(out.detach()) == pytest.approx(0.0, abs=1e-12)
    out.backward()
    assert logp.grad is not None
    a = 0.5 / (1 / math.sqrt(2) + 1e-6)  # 1/sqrt(2), with the estimator's eps (1e-6) in the std
    assert logp.grad[0].tolist() == pytest.approx([-a / 18] * 4, abs=1e-7)
    assert logp.grad[3].tolist() == pytest.approx([a / 6] * 3 + [0.0], abs=1e-7)


async def test_episodes_of_the_agent_loop_batch_with_those_numbers(tok: object) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    row = make_recall_rows(1, seed=3)[0]
    policy = Summarize(trigger=1100)
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=200), context_length=2048, reward_pool=False)
    episodes = []
    for lossy in (0.0, 1.0):  # full summaries answer right; lossy ones lose the early codes
        client = FakePolicyClient(tok, recall_policy(policy.instruction, lossy=lossy))
        episodes.append(await run_episode(LongRecallEnv(row, context_policy=policy), template, client, config,
                                          group_id="g"))
    assert [e.reward for e in episodes] == [1.0, 0.0]
    assert [len(e.sequences) for e in episodes] == [3, 3]
    batch = build_training_batch(episodes)
    assert len(batch.sequences) == 6
    for episode, seqs in zip(episodes, (batch.sequences[:3], batch.sequences[3:]), strict=True):
        trainable = sum(s.num_trainable_tokens for s in episode.sequences)
        sign = 1 if episode.reward else -1
        for seq in seqs:
            assert seq.denominator == trainable and seq.rollout_id == episode.sequences[0].rollout_id
            values = {a for a, m in zip(seq.advantages, seq.loss_mask, strict=True) if m}
            assert len(values) == 1  # two rollouts: +-1/sqrt(2) on every sequence (up to the std's eps)
            assert values.pop() == pytest.approx(sign / math.sqrt(2), abs=1e-5)
