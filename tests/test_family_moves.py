"""`experiments.family_moves`: families gained and lost, pooled over runs, and the plans."""

from __future__ import annotations

from experiments.family_moves import family_table, plan
from flywheel.records import Message, Trajectory


def episode(task: str, calls: list[str], success: bool) -> Trajectory:
    turns = []
    for call in calls:
        turns += [Message(role="assistant", content=f"Thinking.\n<{call}>x</{call}>", loss=True),
                  Message(role="user", content="<result>r</result>")]  # fmt: skip
    return Trajectory(
        task_id=task, env="qa", episode_start=1, reward=float(success), success=success,
        n_steps=len(calls),
        messages=[Message(role="system", content="s"), Message(role="user", content="Q"), *turns],
    )  # fmt: skip


def test_a_family_gained_beside_one_lost_pooled_over_two_runs():
    town, pop = "founder_birth_town/company-1", "combined_population/town-1+town-2"
    two, three = ["search", "search", "answer"], ["search", "search", "python", "answer"]
    run = ({town: episode(town, two, True), pop: episode(pop, two, False)},
           {town: episode(town, three, False), pop: episode(pop, three, True)})  # fmt: skip
    rows = {r["family"]: r for r in family_table([run, run])}
    assert rows["founder_birth_town"] | {"plans_before": 0, "plans_after": 0} == {
        "family": "founder_birth_town", "tasks": 2, "before": 2, "after": 0, "gained": 0,
        "lost": 2, "plans_before": 0, "plans_after": 0,
    }  # fmt: skip
    assert rows["combined_population"]["gained"] == 2 and rows["combined_population"]["lost"] == 0
    assert rows["founder_birth_town"]["plans_after"] == {"search search python answer": 2}


def test_a_reply_without_a_call_reads_as_a_dash_and_json_calls_by_name():
    bare = episode("t/1", [], False)
    bare.messages.append(Message(role="assistant", content="I am not sure.", loss=True))
    bare.messages.append(
        Message(role="assistant", content='<tool_call>{"name": "search"}</tool_call>', loss=True)
    )
    assert plan(bare) == "- search"
