"""Advantage estimators and losses against values worked out by hand on tiny tensors, and masked
positions provably ignored: changing what a masked position holds changes nothing."""

from __future__ import annotations

import math

import pytest
import torch

from training.advantages import (
    aggregate,
    clipped_policy_loss,
    clipped_value_loss,
    discounted_returns,
    gae_advantages,
    gigpo_advantages,
    group_index,
    grpo_advantages,
    kl_k3,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)

SQRT3, SQRT2 = math.sqrt(3), math.sqrt(2)

# Two groups, interleaved: group 7 has rewards [1, 0, 0, 1], group 3 has [2, 4].
REWARDS = torch.tensor([1.0, 2.0, 0.0, 0.0, 4.0, 1.0])
GROUPS = torch.tensor([7, 3, 7, 7, 3, 7])
# Two token positions each; the last sequence's second token was not generated (a tool result).
MASK = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 1], [1, 1], [1, 0]])


def close(actual, expected):
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=1e-5, rtol=0
    )


def on_tokens(per_sequence):
    """The expected per-sequence advantages spread over MASK's tokens."""
    return torch.tensor(per_sequence)[:, None] * MASK


def test_group_index_from_trajectory_group_ids():
    # a sequence without a group is a group of its own
    assert group_index(["a", None, "a", None, "b"]).tolist() == [0, 1, 0, 2, 3]


def test_grpo():
    # group 7: mean 0.5, deviations ±0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 1/sqrt(3);
    #   advantage ±0.5 * sqrt(3) = ±0.8660
    # group 3: mean 3, deviations ∓1, unbiased var = 2 / 1 = 2, std = sqrt(2); ∓1/sqrt(2) = ∓0.7071
    a, b = 0.5 * SQRT3, 1 / SQRT2
    close(grpo_advantages(REWARDS, GROUPS, MASK), on_tokens([a, -b, -a, -a, b, a]))


def test_dr_grpo_does_not_divide_by_the_std():
    # r - group mean: group 7: 1 - 0.5, 0 - 0.5; group 3: 2 - 3, 4 - 3
    expected = on_tokens([0.5, -1.0, -0.5, -0.5, 1.0, 0.5])
    close(grpo_advantages(REWARDS, GROUPS, MASK, scale_by_std=False), expected)


def test_rloo():
    # group 7 [1, 0, 0, 1]: 1 - (0 + 0 + 1) / 3 = 2/3; 0 - (1 + 0 + 1) / 3 = -2/3
    # group 3 [2, 4]: 2 - 4 = -2; 4 - 2 = 2
    c = 2 / 3
    close(rloo_advantages(REWARDS, GROUPS, MASK), on_tokens([c, -2.0, -c, -c, 2.0, c]))


@pytest.mark.parametrize("estimator", [grpo_advantages, rloo_advantages])
def test_equal_rewards_and_groups_of_one_have_zero_advantage(estimator):
    rewards = torch.tensor([3.0, 3.0, 3.0, 5.0, 0.0])  # group 0 all equal; groups 1 and 2 alone
    groups = torch.tensor([0, 0, 0, 1, 2])
    close(estimator(rewards, groups, torch.ones(5, 4)), torch.zeros(5, 4))


@pytest.mark.parametrize("estimator", [grpo_advantages, rloo_advantages])
def test_group_estimators_put_nothing_on_masked_tokens(estimator):
    advantages = estimator(REWARDS, GROUPS, MASK)
    assert advantages[5, 1] == 0 and (advantages[MASK.bool()] != 0).all()


def test_outcome_reward_goes_on_the_last_generated_token():
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    expected = [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]
    close(outcome_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask), expected)


def test_discounted_returns_step_over_generated_tokens_only():
    # tokens 0 and 2 generated, 1 a tool result holding a stray 7.0; gamma 0.5:
    # G_2 = 1.0; G_0 = -0.02 + 0.5 * G_2 = 0.48 (no discount step, no reward at token 1)
    returns = discounted_returns(torch.tensor([[-0.02, 7.0, 1.0]]), torch.tensor([[1, 0, 1]]), 0.5)
    close(returns, [[0.48, 0.0, 1.0]])


# REINFORCE++ case: beta 0.1, gamma 1, reference log-probs 0.
#   sequence 0: mask [1, 1, 0], logp [0.5, -1.0, *], outcome 1.0
#     token rewards [-0.1 * 0.5, -0.1 * -1.0 + 1.0, 0] = [-0.05, 1.1, 0]; returns [1.05, 1.1, 0]
#   sequence 1: mask [1, 0, 1], logp [0.2, *, 0.0], outcome 0.0
#     token rewards [-0.02, 0, 0]; returns [-0.02, 0, 0.0]
#   loss-token returns 1.05, 1.1, -0.02, 0.0: mean 2.13 / 4 = 0.5325
#   deviations 0.5175, 0.5675, -0.5525, -0.5325; squares 0.26780625, 0.32205625, 0.30525625,
#   0.28355625; population var = 1.178675 / 4 = 0.29466875, std = 0.5428340
#   whitened 0.5175 / 0.542834 = 0.953330, 0.5675 / 0.542834 = 1.045439,
#            -0.5525 / 0.542834 = -1.017807, -0.5325 / 0.542834 = -0.980963
RPP_REWARDS = torch.tensor([1.0, 0.0])
RPP_MASK = torch.tensor([[1, 1, 0], [1, 0, 1]])
RPP_EXPECTED = [[0.953330, 1.045439, 0.0], [-1.017807, 0.0, -0.980963]]


def test_reinforce_pp():
    logp = torch.tensor([[0.5, -1.0, 0.0], [0.2, 0.0, 0.0]])
    advantages = reinforce_pp_advantages(RPP_REWARDS, logp, torch.zeros(2, 3), RPP_MASK, beta=0.1)
    close(advantages, RPP_EXPECTED)


def test_reinforce_pp_ignores_what_masked_tokens_hold():
    logp = torch.tensor([[0.5, -1.0, 123.0], [0.2, -55.0, 0.0]])
    ref_logp = torch.tensor([[0.0, 0.0, float("nan")], [0.0, float("inf"), 0.0]])
    advantages = reinforce_pp_advantages(RPP_REWARDS, logp, ref_logp, RPP_MASK, beta=0.1)
    close(advantages, RPP_EXPECTED)


def test_whiten_uses_loss_tokens_only():
    # loss tokens 1 and 3: mean 2, population var 1 -> -1, +1; the 100 is masked
    values, mask = torch.tensor([[1.0, 100.0, 3.0]]), torch.tensor([[1, 0, 1]])
    close(whiten(values, mask), [[-1.0, 0.0, 1.0]])


def test_gae():
    # row 0: mask [1, 0, 1] (token 1 a tool result), rewards [0, *, 1], values [0.5, *, 0.8],
    #   gamma 1, lambda 0.5:
    #   t2: delta = 1 + 0 - 0.8 = 0.2, A = 0.2
    #   t0: next generated is t2: delta = 0 + 0.8 - 0.5 = 0.3, A = 0.3 + 0.5 * 0.2 = 0.4
    #   returns = A + V = [0.9, 0, 1.0]
    # row 1: mask [1, 1, 1], rewards [0, 0, 1], values [0.2, 0.4, 0.6], same gamma, lambda:
    #   t2: delta = 0.4, A = 0.4; t1: delta = 0.6 - 0.4 = 0.2, A = 0.2 + 0.5 * 0.4 = 0.4;
    #   t0: delta = 0.4 - 0.2 = 0.2, A = 0.2 + 0.5 * 0.4 = 0.4; returns [0.6, 0.8, 1.0]
    rewards = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.8], [0.2, 0.4, 0.6]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.5)
    close(advantages, [[0.4, 0.0, 0.2], [0.4, 0.4, 0.4]])
    close(returns, [[0.9, 0.0, 1.0], [0.6, 0.8, 1.0]])


def test_gae_with_discount():
    # gamma 0.9, lambda 0.95: t2: delta = 1 - 0.8 = 0.2, A = 0.2;
    #   t0: delta = 0 + 0.9 * 0.8 - 0.5 = 0.22, A = 0.22 + 0.9 * 0.95 * 0.2 = 0.391
    #   returns [0.891, 0, 1.0]
    rewards, values = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.0, 0.8]])
    advantages, returns = gae_advantages(rewards, values, torch.tensor([[1, 0, 1]]), 0.9, 0.95)
    close(advantages, [[0.391, 0.0, 0.2]])
    close(returns, [[0.891, 0.0, 1.0]])


def test_gae_with_lambda_one_is_return_minus_value():
    # gamma = lambda = 1: A_t = (sum of the rewards from t on) - V_t = 1 - [0.2, 0.4, 0.6]
    advantages, _ = gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.6]]), torch.ones(1, 3), 1.0, 1.0
    )
    close(advantages, [[0.8, 0.6, 0.4]])


def test_gae_ignores_what_masked_tokens_hold():
    mask = torch.tensor([[1, 0, 1]])
    first = gae_advantages(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.0, 0.8]]), mask)
    second = gae_advantages(
        torch.tensor([[0.0, float("nan"), 1.0]]), torch.tensor([[0.5, 1e9, 0.8]]), mask
    )
    close(first[0], second[0])
    close(first[1], second[1])


# Policy loss case: old log-probs 0, so ratio = exp(logp).
#   seq 0: a: ratio 1.5, A +1 -> -min(1.5, 1.2) = -1.2
#          b: ratio 0.5, A -1 -> -min(-0.5, -0.8) = 0.8
#          masked: logp 1000, A 5 (ignored)
#   seq 1: c: ratio 1.1, A +2 -> -min(2.2, 2.2) = -2.2
#          d: ratio 1.5, A -1 -> -min(-1.5, -1.2) = 1.5 (the pessimistic, unclipped side)
#          e: ratio 1.0, A 0.5 -> -0.5
#   token-mean: (-1.2 + 0.8 - 2.2 + 1.5 - 0.5) / 5 = -1.6 / 5 = -0.32
#   sequence-mean: seq 0 (-1.2 + 0.8) / 2 = -0.2, seq 1 (-2.2 + 1.5 - 0.5) / 3 = -0.4 -> -0.3
#   clip_high 0.3: a -> -1.3, the rest as before: (-1.3 + 0.8 - 2.2 + 1.5 - 0.5) / 5 = -0.34
POLICY_ADV = torch.tensor([[1.0, -1.0, 5.0], [2.0, -1.0, 0.5]])
POLICY_MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


def policy_logp():
    ratios = torch.tensor([[1.5, 0.5, 1.0], [1.1, 1.5, 1.0]])
    logp = ratios.log()
    logp[0, 2] = 1000.0
    return logp.requires_grad_()


@pytest.mark.parametrize(
    "aggregation, clip_high, expected",
    [("token-mean", 0.2, -0.32), ("sequence-mean", 0.2, -0.3), ("token-mean", 0.3, -0.34)],
)
def test_clipped_policy_loss(aggregation, clip_high, expected):
    loss = clipped_policy_loss(
        policy_logp(), torch.zeros(2, 3), POLICY_ADV, POLICY_MASK, 0.2, clip_high, aggregation
    )
    close(loss, expected)


def test_policy_gradient_is_finite_and_zero_on_masked_and_clipped_tokens():
    logp = policy_logp()
    clipped_policy_loss(logp, torch.zeros(2, 3), POLICY_ADV, POLICY_MASK).backward()
    # d loss / d logp = -ratio * A / 5 where the unclipped term is the minimum: c: -1.1 * 2 / 5
    #   = -0.44; d: -1.5 * -1 / 5 = 0.3; e: -1.0 * 0.5 / 5 = -0.1. a (ratio 1.5 > 1.2, A > 0) and
    #   b (ratio 0.5 < 0.8, A < 0) take the clipped term, a constant: 0; the masked one: 0
    close(logp.grad, [[0.0, 0.0, 0.0], [-0.44, 0.3, -0.1]])


# Value loss case, old values 0, clip 0.2:
#   v 1.0, R 0.5: unclipped (0.5)^2 = 0.25, clipped v 0.2: (0.3)^2 = 0.09 -> 0.5 * 0.25 = 0.125
#   v 0.1, R 1.0: (0.9)^2 = 0.81, inside the clip -> 0.405
#   v 0.9, R 1.0: (0.1)^2 = 0.01, clipped v 0.2: (0.8)^2 = 0.64 -> 0.32
#   token-mean (0.125 + 0.405 + 0.32) / 3 = 0.283333; sequence-mean ((0.125 + 0.405) / 2 + 0.32) / 2
#   = (0.265 + 0.32) / 2 = 0.2925
@pytest.mark.parametrize(
    "aggregation, expected", [("token-mean", 0.85 / 3), ("sequence-mean", 0.2925)]
)
def test_clipped_value_loss(aggregation, expected):
    values = torch.tensor([[1.0, 0.1], [0.9, float("inf")]], requires_grad=True)
    returns = torch.tensor([[0.5, 1.0], [1.0, 3.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss = clipped_value_loss(values, torch.zeros(2, 2), returns, mask, 0.2, aggregation)
    close(loss, expected)
    loss.backward()
    assert torch.isfinite(values.grad).all() and values.grad[1, 1] == 0


def test_aggregate_skips_sequences_without_loss_tokens():
    losses = torch.tensor([[1.0, 3.0], [7.0, 7.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    close(aggregate(losses, mask, "sequence-mean"), 2.0)
    close(aggregate(losses, mask, "token-mean"), 2.0)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(losses, mask, "sum")


def test_kl_k3():
    # d = ref - logp. logp 0, ref ln 0.5: exp(-0.6931) + 0.6931 - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # logp ln 0.5, ref 0: exp(0.6931) - 0.6931 - 1 = 2 - 0.693147 - 1 = 0.306853; equal: 0
    half = math.log(0.5)
    logp = torch.tensor([[0.0, half, -2.0, 50.0]])
    ref = torch.tensor([[half, 0.0, -2.0, -50.0]])
    close(kl_k3(logp, ref, torch.tensor([[1, 1, 1, 0]])), [[0.193147, 0.306853, 0.0, 0.0]])


@pytest.mark.parametrize("reward", [0.1, 0.3, 1.1, -1.0])
@pytest.mark.parametrize("size", [3, 7, 8])
def test_a_group_of_equal_rewards_has_exactly_zero_advantage(reward, size):
    """Summed in float32, eight rewards of 0.1 have a mean a few ulps off: GRPO's division by
    the near-zero std made that -0.0074 on every token of the group (and the trainer, which skips
    rows whose advantage is exactly 0, trained on them)."""
    rewards = torch.tensor([reward] * size + [1.1, 0.1])
    groups = torch.tensor([0] * size + [1, 1])
    mask = torch.ones(size + 2, 2)
    for advantages in (
        grpo_advantages(rewards, groups, mask),
        grpo_advantages(rewards, groups, mask, scale_by_std=False),
        rloo_advantages(rewards, groups, mask),
    ):
        assert bool((advantages[:size] == 0).all()), advantages[:size, 0]
        assert bool((advantages[size:] != 0).all())


# GiGPO, worked by hand. One group of three episodes (rewards 1, 0, 0) at gamma 0.5; anchor
# states: s0 = 0 (every episode's first turn), s1 = 1 (the second turn of episodes 0 and 2), and
# episode 1's second and third turns in states met once (2, 3).
GIGPO_REWARDS = torch.tensor([1.0, 0.0, 0.0])
GIGPO_GROUPS = torch.tensor([0, 0, 0])
GIGPO_ANCHORS = torch.tensor([[0, 1, -1], [0, 2, 3], [0, 1, -1]])
# Tokens: a prompt token, then two tokens per turn with an observation token between turns.
GIGPO_TURNS = torch.tensor(
    [
        [-1, 0, 0, -1, 1, 1, -1, -1, -1, -1],
        [-1, 0, 0, -1, 1, 1, -1, 2, 2, -1],
        [-1, 0, 0, -1, 1, 1, -1, -1, -1, -1],
    ]
)
GIGPO_MASK = GIGPO_TURNS >= 0


def test_gigpo_is_grpos_episode_advantage_plus_the_anchor_states_step_advantage():
    """Returns: episode 0's turns 0.5 (gamma x 1) and 1; the others' 0. Anchor s0 holds
    {0.5, 0, 0}: mean 1/6, std sqrt(1/12), so +2/sqrt(3) and -1/sqrt(3) twice; s1 holds {1, 0}:
    +-1/sqrt(2); states met once have none. The episode advantage (GRPO on 1, 0, 0) is
    +2/sqrt(3), -1/sqrt(3), -1/sqrt(3)."""
    advantages = gigpo_advantages(
        GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_MASK, GIGPO_TURNS, GIGPO_ANCHORS, gamma=0.5
    )
    e0, e_other = 2 / SQRT3, -1 / SQRT3
    per_turn = {
        0: [e0 + 2 / SQRT3, e0 + 1 / SQRT2],
        1: [e_other - 1 / SQRT3, e_other, e_other],
        2: [e_other - 1 / SQRT3, e_other - 1 / SQRT2],
    }
    expected = torch.zeros(GIGPO_TURNS.shape)
    for row, values in per_turn.items():
        for turn, value in enumerate(values):
            expected[row][GIGPO_TURNS[row] == turn] = value
    close(advantages, expected)


def test_gigpo_without_step_weight_is_grpo_and_shared_states_alone_move_it():
    plain = gigpo_advantages(
        GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_MASK, GIGPO_TURNS, GIGPO_ANCHORS, step_weight=0.0
    )
    close(plain, grpo_advantages(GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_MASK))
    # No state met twice: every step advantage is 0, whatever the returns.
    alone = torch.tensor([[0, 1, -1], [2, 3, 4], [5, 6, -1]])
    close(
        gigpo_advantages(GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_MASK, GIGPO_TURNS, alone),
        grpo_advantages(GIGPO_REWARDS, GIGPO_GROUPS, GIGPO_MASK),
    )


def test_gigpo_anchor_states_never_span_groups():
    """The same state id in two groups (two questions) is two anchor states."""
    groups = torch.tensor([0, 1, 1])
    advantages = gigpo_advantages(
        GIGPO_REWARDS, groups, GIGPO_MASK, GIGPO_TURNS, GIGPO_ANCHORS, gamma=0.5
    )
    # Group 0 is one episode: no advantage at all. Group 1 (rewards 0, 0): none either.
    close(advantages, torch.zeros(GIGPO_TURNS.shape))
