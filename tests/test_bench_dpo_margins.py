"""experiments/dpo_margins.py's arithmetic, against hand-computed values."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from experiments import dpo_margins


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


def test_a_command_counts_when_every_token_after_action_is_ranked_first():
    third = math.log(3)
    model = FixedLogits([[0, third, 0], [third, 0, 0], [0, third, 0], [0, 0, 0]])
    ids, mask = [0, 1, 2, 1], [0, 1, 1, 1]  # ids 1, 2, 1 predicted: first, not, first
    last_only = dpo_margins.score(model, ids, mask, actions=[(3, 4)])
    assert (last_only.actions, last_only.actions_exact) == (1, 1)
    with_a_miss = dpo_margins.score(model, ids, mask, actions=[(2, 4)])
    assert (with_a_miss.actions, with_a_miss.actions_exact) == (1, 0)


def test_action_spans_start_after_the_token_that_completes_action():
    words = {0: "<p>", 1: "Thought: x\n", 2: "Action", 3: ":", 4: " get", 5: " log", 6: "<end>"}
    tokenizer = SimpleNamespace(decode=lambda ids: "".join(words[i] for i in ids))
    ids = [0, 1, 2, 3, 4, 5, 6, 0, 1, 4]
    mask = [0, 1, 1, 1, 1, 1, 1, 0, 1, 1]  # the second turn has no "Action:"
    assert dpo_margins.action_spans(tokenizer, ids, mask) == [(4, 7)]
