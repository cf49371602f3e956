"""experiments/revision_turns.py on hand-made episodes: refused actions, recoveries, revision turns."""

import json
from pathlib import Path

import pytest

from experiments import revision_turns
from tasks.splice import REVISION_THOUGHTS


def episode(task: str, turns: list[tuple[str, str]], solved: bool) -> dict:
    messages = [{"role": "system", "content": "craft"}, {"role": "user", "content": "goal"}]
    for reply, observation in turns:
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": f"Observation: {observation}"},
        ]
    return {"task_id": task, "env": "textcraft", "episode_start": 0, "messages": messages,
            "success": solved}  # fmt: skip


def write_stage(run: Path, stage: str, episodes: list[dict]) -> None:
    folder = run / "evaluate-validation" / stage
    folder.mkdir(parents=True)
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))


REVISION = f"Thought: {REVISION_THOUGHTS[1]}\nAction: inventory"
LOOK = "Thought: I check what I have.\nAction: inventory"
EPISODES = [
    # refused, then revised and solved
    episode(
        "a",
        [("get 1 x", "Could not find x"), (REVISION, "Inventory: []"), ("get 1 y", "Got 1 y")],
        True,
    ),  # fmt: skip
    episode("b", [("get 1 x", "Could not find x"), ("get 1 x", "Could not find x")], False),
    episode("c", [("get 1 y", "Got 1 y")], True),
    episode("d", [("craft 1 z", "Crafted 1 z")], False),
    # the revision's action after a refusal, without its thought
    episode("e", [("get 1 x", "Could not find x"), (LOOK, "Inventory: []")], False),
    # the no-op where nothing was refused
    episode("f", [(LOOK, "Inventory: []"), ("get 1 x", "Could not find x")], False),
]


def test_counts_refusals_recoveries_and_revision_turns(tmp_path, capsys):
    write_stage(tmp_path, "agent-r-round-1", EPISODES)
    write_stage(tmp_path, "sft", EPISODES[1:4])
    revision_turns.main([str(tmp_path), "--split", "validation"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[2:] == ["| agent-r-round-1 | 6 | 4 | 1 | 2 | 1 |", "| sft | 3 | 1 | 0 | 0 | 0 |"]


def test_a_refusal_only_counts_in_an_observation(tmp_path):
    said = episode("e", [("Could not decide; get 1 y", "Got 1 y")], True)
    records = [revision_turns.Trajectory.model_validate(said)]
    assert revision_turns.revision_behaviour(records)["refused"] == 0


def test_an_unknown_stage_is_named_with_the_evaluated_ones(tmp_path, capsys):
    write_stage(tmp_path, "sft", EPISODES)
    with pytest.raises(SystemExit):
        revision_turns.main([str(tmp_path), "round-9", "--split", "validation"])
    err = capsys.readouterr().err
    assert "round-9" in err and "['sft']" in err


def test_lists_revision_rows_against_the_step_limit(tmp_path, capsys):
    write_stage(tmp_path, "sft", EPISODES)
    rows = [
        EPISODES[0],  # 3 agent turns, one of them a revision
        episode("g", [("get 1 x", "Could not find x"), (REVISION, "Inventory: []")] * 2, False),
        EPISODES[2],  # a good path: no revision, not listed
    ]
    data = tmp_path / "round-1" / "revisions"
    data.mkdir(parents=True)
    (data / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    revision_turns.main([str(tmp_path), "--split", "validation", "--max-steps", "3"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "round-1: 2 revision rows, 1 within 3 agent turns; turns: [3, 4]"
