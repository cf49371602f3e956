"""experiments/rl_signal.py on hand-made groups: which episodes a round trains on, and each kind's
GRPO advantage summed plainly and by loss tokens."""

from __future__ import annotations

import math

import pytest

from experiments.rl_signal import advantage_by_kind, behaviour, trained_groups
from flywheel.records import Message, Trajectory


def episode(group: str, reward: float, success: bool, reply: str, tokens: int, answered=True):
    return Trajectory(
        task_id=f"{group}/q", env="qa", group_id=group, episode_start=0, reward=reward,
        success=success, metrics={"answered": float(answered)},
        messages=[
            Message(role="user", content="Question: ?"),
            Message(role="assistant", content=reply, loss=True, token_ids=[7] * tokens),
        ],
    )  # fmt: skip


GROUPS = [
    episode("age", 1.1, True, "<python>1</python>", 10),
    episode("age", 0.0, False, "<search>a</search><python>1</python>", 30, answered=False),
    episode("town", 1.1, True, "<search>a</search>", 5),
    episode("town", 0.1, False, "<search>b</search>", 20),
    episode("flat", 0.1, False, "<search>c</search>", 5),  # no success: never mixed
    episode("flat", 0.0, False, "<search>c</search>", 5, answered=False),
]


def test_mixed_keeps_groups_with_a_success_and_a_failure_all_any_reward_variance():
    assert {e.group_id for e in trained_groups(GROUPS, "mixed")} == {"age", "town"}
    assert {e.group_id for e in trained_groups(GROUPS, "all")} == {"age", "town", "flat"}


def test_each_kind_gets_its_grpo_advantage_plain_and_by_loss_tokens():
    table = advantage_by_kind(trained_groups(GROUPS, "mixed"))
    # two episodes a group: (r - mean) / unbiased std = +-1/sqrt(2), whatever the rewards
    half = 1 / math.sqrt(2)
    expected = {
        ("answered", "success", "python"): (1, half, 10 * half),
        ("no answer", "failure", "search+python"): (1, -half, -30 * half),
        ("answered", "success", "search"): (1, half, 5 * half),
        ("answered", "failure", "search"): (1, -half, -20 * half),
    }
    assert set(table) == set(expected)
    for key, (n, total, by_tokens) in expected.items():
        assert table[key]["n"] == n
        assert table[key]["sum"] == pytest.approx(total, abs=1e-5)
        assert table[key]["token_sum"] == pytest.approx(by_tokens, abs=1e-4)


def test_behaviour_counts_solved_and_averages_metrics_per_family():
    rows = behaviour(GROUPS)
    assert rows["age"]["episodes"] == 2 and rows["age"]["solved"] == 1
    assert rows["age"]["episode_answered"] == 0.5 and rows["flat"]["solved"] == 0
