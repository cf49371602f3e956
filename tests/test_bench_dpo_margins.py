"""bench/dpo_margins.py's arithmetic, against hand-computed values."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from bench import dpo_margins


def test_mask_runs_are_the_agent_turns():
    assert dpo_margins.mask_runs([0, 1, 1, 0, 1]) == [(1, 3), (4, 5)]
    assert dpo_margins.mask_runs([0, 0]) == []


class FixedLogits:
    """Logits the test chose, one row a position, whatever the ids."""

    def __init__(self, rows):
        import torch

        self.logits = torch.tensor([rows], dtype=torch.float32)

    def __call__(self, ids):
        return SimpleNamespace(logits=self.logits)


def test_score_sums_masked_log_probabilities_and_counts_greedy_turns():
    third = math.log(3)
    # position i predicts ids[i + 1]; each row puts 3/5 on one token, 1/5 on the others
    model = FixedLogits([[0, third, 0], [third, 0, 0], [0, third, 0], [0, 0, 0]])
    ids, mask = [0, 1, 2, 1], [0, 1, 1, 1]  # targets 1, 2, 1: ranked first, not, ranked first
    scored = dpo_margins.score(model, ids, mask)
    assert scored.logp == pytest.approx(2 * math.log(3 / 5) + math.log(1 / 5), abs=1e-5)
    assert (scored.tokens, scored.top1, scored.turns, scored.turns_exact) == (3, 2, 1, 0)
    two_turns = dpo_margins.score(model, ids, [0, 1, 0, 1])  # targets 1 and 1: both first
    assert (two_turns.tokens, two_turns.turns, two_turns.turns_exact) == (2, 2, 2)


def test_pair_summary_is_dpo_s_implicit_reward_margin():
    def pair(chosen, rejected):
        return {"chosen": SimpleNamespace(logp=chosen), "rejected": SimpleNamespace(logp=rejected)}

    start = [pair(-10.0, -12.0), pair(-20.0, -15.0)]
    after = [pair(-11.0, -16.0), pair(-19.0, -16.0)]  # changes: (-1, -4) and (+1, -1)
    summary = dpo_margins.pair_summary(start, after, beta=0.1)
    assert summary["chosen change"] == pytest.approx(0.0)
    assert summary["rejected change"] == pytest.approx(-2.5)
    assert summary["margin"] == pytest.approx((0.1 * 3 + 0.1 * 2) / 2)
    assert summary["ranked right"] == 2
