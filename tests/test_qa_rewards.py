"""QA rewards against values worked out by hand."""

from __future__ import annotations

import pytest

from envs.qa_rewards import (
    RewardWeights,
    best_f1,
    exact_match,
    normalize_answer,
    qa_reward,
    token_f1,
)


@pytest.mark.parametrize(
    "text, normalised",
    [
        ("The Cat  sat.", "cat sat"),
        ("  An apple, a pear!  ", "apple pear"),
        ("Theatre of the Absurd", "theatre of absurd"),  # "the" inside a word stays
        ("1,370,548", "1370548"),  # thousands separators are punctuation
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize_answer(text, normalised):
    assert normalize_answer(text) == normalised


def test_exact_match_takes_any_gold_answer():
    assert exact_match("the Nile", ["Nile"]) == 1.0
    assert exact_match("Percy Shelley", ["Percy Bysshe Shelley", "Percy Shelley"]) == 1.0
    assert exact_match("Nile river", ["Nile"]) == 0.0


@pytest.mark.parametrize(
    "prediction, answer, f1",
    [
        # "cat sat" vs "cat sat down": 2 shared; precision 2/2, recall 2/3;
        # F1 = 2 * 1 * 2/3 / (1 + 2/3) = (4/3) / (5/3) = 0.8
        ("the cat sat", "a cat sat down", 0.8),
        # "new york city" vs "york": 1 shared; p = 1/3, r = 1; F1 = 2 * 1/3 / (4/3) = 0.5
        ("New York City", "York", 0.5),
        # "a a b" -> "b" (articles go) vs "b b": shared = min(1, 2) = 1;
        # p = 1/1, r = 1/2; F1 = 2 * 1/2 / (3/2) = 2/3
        ("a a b", "b b", 2 / 3),
        ("Paris", "London", 0.0),
        # HotpotQA: yes/no only match themselves, however many tokens overlap
        ("yes", "no", 0.0),
        ("yes", "yes", 1.0),
        ("no idea", "no", 0.0),
        ("", "", 1.0),  # both empty
        ("the", "Paris", 0.0),  # normalises to nothing
    ],
)
def test_token_f1(prediction, answer, f1):
    assert token_f1(prediction, answer) == pytest.approx(f1)


def test_best_f1_over_aliases():
    # "shelley" vs "percy bysshe shelley": p = 1, r = 1/3 -> 0.5; vs "percy shelley": r = 1/2 ->
    # 2 * 1/2 / (3/2) = 2/3
    assert best_f1("Shelley", ["Percy Bysshe Shelley", "Percy Shelley"]) == pytest.approx(2 / 3)
    assert best_f1("x", []) == 0.0


def test_reward_with_the_default_weights():
    # format 0.1 + F1 0.8 * 1.0 = 0.9
    reward = qa_reward("the cat sat", ["a cat sat down"], format_valid=True)
    assert reward.total == pytest.approx(0.9)
    assert (reward.exact_match, reward.f1, reward.format) == (0.0, pytest.approx(0.8), 1.0)


def test_a_malformed_reply_earns_nothing_for_its_answer():
    reward = qa_reward("Paris", ["Paris"], format_valid=False)
    assert reward.total == 0.0 and reward.exact_match == 1.0 and reward.format == 0.0


def test_no_answer():
    reward = qa_reward(None, ["Paris"], format_valid=True)
    assert (reward.total, reward.exact_match, reward.f1) == (pytest.approx(0.1), 0.0, 0.0)


def test_exact_match_metric_and_capped_process_reward():
    weights = RewardWeights(
        answer_metric="em", answer_weight=2.0, format_weight=0.5, tool_call_weight=0.05,
        max_rewarded_tool_calls=3,
    )  # fmt: skip
    # EM 0 (F1 would be 0.8): 0.5 + 2.0 * 0 + 0.05 * min(7, 3) = 0.5 + 0.15 = 0.65
    reward = qa_reward(
        "the cat sat", ["a cat sat down"], True, successful_tool_calls=7, weights=weights
    )
    assert reward.total == pytest.approx(0.65) and reward.process == pytest.approx(0.15)
    # EM 1: 0.5 + 2.0 + 0.05 * 2 = 2.6
    reward = qa_reward(
        "Cat sat down", ["a cat sat down"], True, successful_tool_calls=2, weights=weights
    )
    assert reward.total == pytest.approx(2.6)
    # malformed: only the process part, 0.05 * 1
    reward = qa_reward(
        "Cat sat down", ["a cat sat down"], False, successful_tool_calls=1, weights=weights
    )
    assert reward.total == pytest.approx(0.05)
