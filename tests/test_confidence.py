import math

import pytest

from flywheel.confidence import (
    gained_and_lost,
    mcnemar_exact,
    mcnemar_tasks_needed,
    paired_bootstrap,
    paired_bootstrap_over_seeds,
    paired_comparison,
    paired_ratio_bootstrap,
    wilson_interval,
)


def test_wilson_interval_against_hand_computed_values():
    # 4 of 26: p = 0.15385, z^2/n = 0.14775; centre 0.19841, half-width 0.13691.
    low, high = wilson_interval(4, 26)
    assert low == pytest.approx(0.0615, abs=5e-4) and high == pytest.approx(0.3353, abs=5e-4)
    # 0 of 12: [0, z^2/(n + z^2)] = [0, 3.8415 / 15.8415].
    assert wilson_interval(0, 12) == (0.0, pytest.approx(0.2425, abs=5e-4))
    # 10 of 10 mirrors 0 of 10.
    assert wilson_interval(10, 10) == (pytest.approx(1 - wilson_interval(0, 10)[1]), 1.0)
    # 13 of 26: centre 0.5, half-width 1.96 * sqrt(0.25/26 + 0.14775/104) / 1.14775 = 0.1794.
    assert wilson_interval(13, 26) == (
        pytest.approx(0.3206, abs=2e-4),
        pytest.approx(0.6794, abs=2e-4),
    )


def test_no_trials_say_nothing_and_impossible_counts_are_refused():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="5 successes in 4 trials"):
        wilson_interval(5, 4)


def test_exact_mcnemar_against_hand_computed_values():
    # 7 gained, 1 lost: 2 * (C(8,0) + C(8,1)) / 2^8 = 2 * 9 / 256.
    assert mcnemar_exact(7, 1) == 0.0703125
    assert mcnemar_exact(1, 7) == 0.0703125  # two-sided: the direction does not matter
    assert mcnemar_exact(5, 0) == 0.0625  # 2 / 2^5
    # 10 gained, 2 lost: 2 * (1 + 12 + 66) / 4096.
    assert mcnemar_exact(10, 2) == pytest.approx(158 / 4096)
    assert mcnemar_exact(3, 3) == 1.0  # 2 * 42 / 64 > 1: capped
    assert mcnemar_exact(0, 0) == 1.0  # no discordant task: no evidence
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_gained_and_lost_count_discordant_tasks_both_stages_read():
    before = {"a": True, "b": False, "c": False, "d": True, "only-before": True}
    after = {"a": True, "b": True, "c": False, "d": False, "only-after": True}
    assert gained_and_lost(before, after) == (1, 1)
    assert gained_and_lost(after, before) == (1, 1)
    assert gained_and_lost({"a": False, "b": False}, {"a": True, "b": True}) == (2, 0)


def test_paired_bootstrap_keeps_each_tasks_outcomes_together():
    fails = {"a": False, "b": False, "c": False}
    solves = {"a": True, "b": True, "c": True}
    assert paired_bootstrap(fails, solves, 200) == (1.0, 1.0)
    assert paired_bootstrap(solves, fails, 200) == (-1.0, -1.0)  # after minus before
    # Both stages solve the same task: every resample's difference is 0. Unpaired resampling
    # would draw the two stages' tasks apart and give an interval around 0 instead.
    same = {"a": True, "b": False, "c": False}
    assert paired_bootstrap(same, dict(same), 200) == (0.0, 0.0)
    # One of two tasks gained: a resample's mean is 0, 1/2 or 1 (chances 1/4, 1/2, 1/4).
    low, high = paired_bootstrap({"a": False, "b": False}, {"a": True, "b": False}, 400)
    assert (low, high) == (0.0, 1.0)
    # Seeded: the same seed, the same interval.
    before, after = (
        {f"t{i}": i % 3 == 0 for i in range(30)},
        {f"t{i}": i % 2 == 0 for i in range(30)},
    )
    assert paired_bootstrap(before, after, 500, seed=3) == paired_bootstrap(before, after, 500, 3)


def test_the_bootstrap_over_seeds_resamples_seeds_too():
    fails = {"a": False, "b": False}
    # Seed 0 gains both tasks, seed 1 neither: drawing seed 0 twice gives +1, seed 1 twice 0.
    pairs = [(fails, {"a": True, "b": True}), (fails, dict(fails))]
    assert paired_bootstrap_over_seeds(pairs, 400) == (0.0, 1.0)
    # Seeds that agree leave only the tasks' spread.
    agreeing = [(fails, {"a": True, "b": True})] * 3
    assert paired_bootstrap_over_seeds(agreeing, 200) == (1.0, 1.0)
    with pytest.raises(ValueError, match="share no task"):
        paired_bootstrap_over_seeds([({"a": True}, {"b": True})])


def test_tasks_a_five_point_difference_needs_against_the_formula():
    # d = 0.10, diff = 0.05: (1.95996 * 0.316228 + 0.841621 * 0.312250)^2 / 0.0025
    # = (0.619795 + 0.262796)^2 / 0.0025 = 0.778967 / 0.0025 = 311.6 -> 312.
    assert mcnemar_tasks_needed(0.10, 0.05) == 312
    # d = 0.05: (1.95996 * 0.223607 + 0.841621 * 0.217945)^2 / 0.0025
    # = (0.438261 + 0.183427)^2 / 0.0025 = 0.386496 / 0.0025 = 154.6 -> 155.
    assert mcnemar_tasks_needed(0.05, 0.05) == 155
    with pytest.raises(ValueError):
        mcnemar_tasks_needed(0.02, 0.05)  # fewer discordant tasks than the difference


def test_paired_comparison_pools_hand_counted_cells_over_runs():
    # Run 0 on a, b, c: b gained, a lost. Run 1 on a, b (c unread after): a gained.
    pairs = [
        ({"a": True, "b": False, "c": False}, {"a": False, "b": True, "c": False}),
        ({"a": False, "b": False}, {"a": True, "b": False}),
    ]
    compared = paired_comparison(pairs, 400)
    assert {k: compared[k] for k in ("cells", "gained", "lost")} == {
        "cells": 5,
        "gained": 2,
        "lost": 1,
    }
    assert compared["difference"] == 0.2  # (2 - 1) / 5 cells both read
    assert compared["p"] == 1.0  # 2 * (1 + 3) / 8, capped
    assert compared["low"] <= 0.2 <= compared["high"]


def test_paired_ratio_bootstrap_of_calls_per_correct_answer():
    # Before: every task 2 calls and solved (ratio 2); after: 1 call and solved (ratio 1).
    # Every resample reads -1: a point.
    before = {t: (2.0, 1) for t in "abcd"}
    after = {t: (1.0, 1) for t in "abcd"}
    assert paired_ratio_bootstrap([(before, after)], 400) == (-1.0, -1.0, 0.0)
    # Before solves nothing: no resample has a ratio for it.
    low, high, undefined = paired_ratio_bootstrap([({"a": (3.0, 0)}, {"a": (1.0, 1)})], 50)
    assert math.isnan(low) and math.isnan(high) and undefined == 1.0
    # Ratios of sums, not means of ratios: before a (4, 1), b (0, 1) -> 2 per answer; after
    # a (1, 1), b (1, 1) -> 1. Resamples of (a, a) give -3, (b, b) +1, mixed -1.
    low, high, undefined = paired_ratio_bootstrap(
        [({"a": (4.0, 1), "b": (0.0, 1)}, {"a": (1.0, 1), "b": (1.0, 1)})], 400
    )
    assert (low, high, undefined) == (-3.0, 1.0, 0.0)
