"""`experiments.step_decisions`: the step pairs' votes at each state, per family and pooled."""

from __future__ import annotations

from collections import Counter

from experiments.step_decisions import net, state, votes
from flywheel.records import Message, Pair


def reply(tool: str) -> Message:
    return Message(role="assistant", content=f"Thinking.\n<{tool}>x</{tool}>", loss=True)


def step_pair(task: str, before: list[str], chosen: str, rejected: str) -> Pair:
    """A pair at step len(before), after a worked example of one search and one answer."""
    example = [Message(role="user", content="example"), reply("search"),
               Message(role="user", content="r"), reply("answer")]  # fmt: skip
    turns = []
    for tool in before:
        turns += [reply(tool), Message(role="user", content="<result>r</result>")]
    return Pair(
        task_id=task, step=len(before), chosen_reward=1.0, rejected_reward=0.0,
        prompt=[Message(role="system", content="s"), *example,
                Message(role="user", content="Q"), *turns],
        chosen=[reply(chosen)], rejected=[reply(rejected)],
    )  # fmt: skip


def test_state_reads_only_the_task_turns_not_the_worked_example():
    assert state(step_pair("f/1", ["search", "search"], "answer", "python")) == "search search"
    assert state(step_pair("f/1", [], "search", "answer")) == "(start)"


def test_votes_per_family_and_pooled_with_net_moves():
    two = ["search", "search"]
    pairs = [
        step_pair("founder_birth_town/c-1", two, "answer", "python"),
        step_pair("founder_birth_town/c-2", two, "answer", "python"),
        step_pair("founder_age/c-3", two, "python", "answer"),
        step_pair("founder_age/c-4", two, "python", "python"),  # same tool: no vote
    ]
    table = votes(pairs)
    assert set(table) == {"search search"}
    groups = table["search search"]
    assert groups["founder_age"] == Counter({("python", "answer"): 1})
    assert groups["all"] == Counter({("answer", "python"): 2, ("python", "answer"): 1})
    assert net(groups["all"]) == Counter({"answer": 1, "python": -1})
