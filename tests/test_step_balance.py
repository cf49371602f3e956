"""`tasks.step_balance`: each contrast of two kinds of move keeps as many pairs each way, at each
step position; hand-counted."""

from __future__ import annotations

from collections import Counter

import pytest

from envs.tools import call_action, malformed_action
from flows.eto import ETOConfig
from flywheel.records import Message, Pair
from tasks.step_balance import balanced, move_kind


def pair(task: str, step: int | None, chosen: str, rejected: str) -> Pair:
    """A pair whose sides' contents are the move kinds themselves (read by `kind` below)."""
    return Pair(
        task_id=task, step=step, chosen_reward=1.0, rejected_reward=0.0,
        prompt=[Message(role="user", content="Q")],
        chosen=[Message(role="assistant", content=chosen, loss=True)],
        rejected=[Message(role="assistant", content=rejected, loss=True)],
    )  # fmt: skip


def kind(p: Pair) -> tuple[str, str]:
    return p.chosen[0].content, p.rejected[0].content


def contrasts(pairs: list[Pair]) -> Counter:
    return Counter((p.step, *kind(p)) for p in pairs)


def test_the_larger_direction_of_each_contrast_is_cut_to_the_smaller():
    pairs = (
        [pair(f"town/{i}", 2, "answer", "python") for i in range(5)]
        + [pair(f"age/{i}", 2, "python", "answer") for i in range(2)]
        + [pair(f"first/{i}", 2, "search", "python") for i in range(3)]  # one direction: kept
        + [pair("age/9", 2, "python", "python")]  # the same kind: no vote, kept
        + [pair("town/9", 3, "python", "answer")]  # another position: its own contrast
        + [pair("town/8", None, "search", "answer")]  # a trajectory pair: kept
    )
    kept = balanced(pairs, kind, seed=0)
    assert contrasts(kept) == Counter(
        {(2, "answer", "python"): 2, (2, "python", "answer"): 2, (2, "search", "python"): 3,
         (2, "python", "python"): 1, (3, "python", "answer"): 1, (None, "search", "answer"): 1}
    )  # fmt: skip
    assert [p for p in pairs if p in kept] == kept  # the order kept


def test_the_draw_is_the_seeds():
    pairs = [pair(f"t/{i}", 1, "a", "b") for i in range(6)] + [pair("u/0", 1, "b", "a")]
    first = balanced(pairs, kind, seed=3)
    assert first == balanced(pairs, kind, seed=3)
    assert len(first) == 2
    draws = {tuple(p.task_id for p in balanced(pairs, kind, seed=s)) for s in range(8)}
    assert len(draws) > 1


def test_move_kind_reads_tool_calls_and_text_actions():
    assert move_kind(call_action("python", {"code": "1+1"})) == "python"
    assert move_kind(call_action("answer", {"answer": "Oslo"})) == "answer"
    assert move_kind("craft 4 oak planks using 1 oak log") == "craft"
    assert move_kind("Get 1 oak log") == "get"
    assert move_kind(malformed_action("no call")) == "-"
    assert move_kind(None) == "-"


def test_step_balance_without_the_step_level_is_refused():
    with pytest.raises(ValueError, match="explore.level=step"):
        ETOConfig.model_validate({"explore": {"step_balance": True}})
