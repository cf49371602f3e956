"""The efficiency reward at points worked out by hand: the shaping factors around the group mean,
the z-scored length, zero-spread groups, the format term, and the decay of sigma to 0."""

from __future__ import annotations

import math

import pytest

from training.efficiency import (
    SIGMA_LENGTH,
    SIGMA_TOOL,
    decayed_sigma,
    efficiency_rewards,
    length_factors,
    shaping,
    tool_factors,
    z_scores,
)

# 2 / (1 + exp(x)) at the points the tests use (by hand: e^0.2 = 1.221402758,
# e^0.5 = 1.648721271)
TOOL_FEWER = 2 / (1 + 1 / 1.221402758)  # one call below the mean, sigma 0.2: 1.0996680
TOOL_MORE = 2 / (1 + 1.221402758)  # one call above: 0.9003320
LENGTH_SHORTER = 2 / (1 + 1 / 1.648721271)  # z = -1, sigma 0.5: 1.2449187
LENGTH_LONGER = 2 / (1 + 1.648721271)  # z = +1: 0.7550813


def close(actual, expected):
    assert actual == pytest.approx(expected, abs=1e-7)


def test_the_defaults_are_the_papers():
    assert (SIGMA_TOOL, SIGMA_LENGTH) == (0.2, 0.5)


def test_shaping_is_one_at_the_mean_and_between_zero_and_two():
    close(shaping(0.0, 0.2), 1.0)
    close(shaping(-1.0, 0.2), TOOL_FEWER)
    close(shaping(1.0, 0.2), TOOL_MORE)
    close(shaping(-1.0, 0.2) + shaping(1.0, 0.2), 2.0)  # symmetric about 1
    assert shaping(-1e4, 0.2) == 2.0 and shaping(1e4, 0.2) == 0.0  # no overflow either way


def test_tool_factor_uses_the_raw_deviation_from_the_group_mean():
    # calls [1, 3, 3, 1]: mean 2, deviations -1, +1, +1, -1
    close(tool_factors([1, 3, 3, 1]), [TOOL_FEWER, TOOL_MORE, TOOL_MORE, TOOL_FEWER])
    # calls [0, 4]: deviations -2, +2 (not z-scored, which would be -1, +1):
    # 2 / (1 + e^-0.4) = 1.1973753, 2 / (1 + e^0.4) = 0.8026247
    close(tool_factors([0, 4]), [1.1973753202, 0.8026246798])


def test_length_factor_uses_the_population_z_score():
    # lengths [100, 300, 100, 300]: mean 200, population std 100 -> z = -1, +1, -1, +1
    # (the sample std, 115.47, would give z = +-0.866)
    assert z_scores([100, 300, 100, 300]) == [-1.0, 1.0, -1.0, 1.0]
    close(
        length_factors([100, 300, 100, 300]),
        [LENGTH_SHORTER, LENGTH_LONGER, LENGTH_SHORTER, LENGTH_LONGER],
    )
    # the scale of the lengths does not matter, only where each stands in its group
    close(length_factors([1000, 3000, 1000, 3000]), length_factors([1, 3, 1, 3]))


def test_a_group_without_spread_has_factors_of_one():
    assert z_scores([250, 250, 250]) == [0.0, 0.0, 0.0]
    assert length_factors([250, 250, 250]) == [1.0, 1.0, 1.0]
    assert tool_factors([2, 2, 2]) == [1.0, 1.0, 1.0]
    assert length_factors([42]) == [1.0]  # a group of one
    # the reward is then correctness plus the format term
    rewards = efficiency_rewards([1.0, 0.5, 0.0], [2, 2, 2], [80, 80, 80], [True, True, False])
    close(rewards, [1.0, 0.5, -1.0])


def test_rewards_of_a_group_at_chosen_points():
    # rollout  correct  calls (dev)  length (z)  format
    #    0       1        1 (-1)      100 (-1)    ok     1 * 1.0996680 * 1.2449187     = 1.3689972
    #    1       1        3 (+1)      300 (+1)    ok     1 * 0.9003320 * 0.7550813     = 0.6798239
    #    2       0        3 (+1)      100 (-1)    ok     0
    #    3       0.5      1 (-1)      300 (+1)    bad    0.5 * 1.0996680 * 0.7550813 - 1 = -0.5848306
    rewards = efficiency_rewards(
        [1.0, 1.0, 0.0, 0.5], [1, 3, 3, 1], [100, 300, 100, 300], [True, True, True, False]
    )
    close(rewards[0], 1.3689972090)
    close(rewards[1], 0.6798238949)
    assert rewards[2] == 0.0
    close(rewards[3], 0.5 * 1.0996679946 * 0.7550813376 - 1)


def test_the_format_term():
    # one rollout: factors 1; wrong and ill-formatted: -1; right and ill-formatted: 1 - 1 = 0
    assert efficiency_rewards([0.0], [3], [10], [False]) == [-1.0]
    assert efficiency_rewards([1.0], [3], [10], [False]) == [0.0]
    assert efficiency_rewards([1.0], [3], [10], [True]) == [1.0]


def test_sigma_zero_is_plain_correctness():
    rewards = efficiency_rewards(
        [1.0, 1.0, 0.0, 0.5],
        [1, 3, 3, 1],
        [100, 300, 100, 300],
        [True, True, True, False],
        sigma_tool=0.0,
        sigma_length=0.0,
    )
    assert rewards == [1.0, 1.0, 0.0, -0.5]


def test_sigmas_are_used_each_for_its_own_factor():
    # only the tool sigma: lengths count for nothing
    rewards = efficiency_rewards([1.0, 1.0], [1, 3], [100, 300], [True, True], 0.2, 0.0)
    close(rewards, [TOOL_FEWER, TOOL_MORE])
    rewards = efficiency_rewards([1.0, 1.0], [1, 3], [100, 300], [True, True], 0.0, 0.5)
    close(rewards, [LENGTH_SHORTER, LENGTH_LONGER])


def test_bad_groups_are_refused():
    with pytest.raises(ValueError):
        efficiency_rewards([], [], [], [])
    with pytest.raises(ValueError):
        efficiency_rewards([1.0, 0.0], [1], [10, 20], [True, True])
    with pytest.raises(ValueError):
        efficiency_rewards([1.0], [1], [10], [True], sigma_tool=-0.2)


def test_sigma_decays_linearly_to_zero_over_a_stage():
    # 10 optimiser steps: 0.2 at step 0, 0.1 halfway, 0.02 at the last update (step 9), 0 at 10
    close(decayed_sigma(0.2, 0, 10), 0.2)
    close(decayed_sigma(0.2, 5, 10), 0.1)
    close(decayed_sigma(0.2, 9, 10), 0.02)
    assert decayed_sigma(0.2, 10, 10) == 0.0
    assert decayed_sigma(0.2, 15, 10) == 0.0  # never below 0
    close(decayed_sigma(0.5, 1, 4), 0.375)
    # the whole schedule of a 4-step stage: equal steps down
    close([decayed_sigma(0.5, s, 4) for s in range(5)], [0.5, 0.375, 0.25, 0.125, 0.0])


def test_decay_refuses_a_stage_without_steps():
    with pytest.raises(ValueError):
        decayed_sigma(0.2, 0, 0)
    with pytest.raises(ValueError):
        decayed_sigma(0.2, -1, 10)


def test_the_end_of_the_decay_gives_the_same_reward_as_sigma_zero():
    sigma_tool = decayed_sigma(SIGMA_TOOL, 100, 100)
    sigma_length = decayed_sigma(SIGMA_LENGTH, 100, 100)
    rewards = efficiency_rewards(
        [1.0, 0.0], [0, 9], [5, 500], [True, True], sigma_tool, sigma_length
    )
    assert rewards == [1.0, 0.0]
    assert not math.isclose(efficiency_rewards([1.0, 0.0], [0, 9], [5, 500], [True, True])[0], 1.0)
