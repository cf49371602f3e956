"""experiments/stage_diff.py and experiments/failed_turns.py on hand-made records: identical episodes, tasks
gained and lost; trained turns answered by a failed action."""

import json
from pathlib import Path

import pytest

from experiments import stage_diff


def write_stage(
    run: Path, stage: str, episodes: dict[str, tuple[list[str], bool]], split: str = "evaluate"
) -> None:
    folder = run / split / stage
    folder.mkdir(parents=True)
    lines = []
    for task, (replies, solved) in episodes.items():
        messages = [{"role": "user", "content": "goal"}]
        for reply in replies:
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "ok"}]
        record = {"task_id": task, "env": "textcraft", "episode_start": 0, "messages": messages}
        lines.append(json.dumps({**record, "success": solved}))
    (folder / "trajectories.jsonl").write_text("\n".join(lines) + "\n")


def test_counts_identical_episodes_and_the_tasks_gained_and_lost(tmp_path, capsys):
    write_stage(tmp_path, "sft", {"a": (["x"], True), "b": (["y"], False), "c": (["z"], False)})
    write_stage(
        tmp_path, "round-1", {"a": (["x", "w"], False), "b": (["y"], False), "c": (["q"], True)}
    )
    stage_diff.main([str(tmp_path), "sft", "round-1"])
    assert capsys.readouterr().out.strip() == (
        "sft -> round-1: 1/3 episodes identical; gained 1 ['c'], lost 1 ['a']"
    )


def test_the_validation_split_reads_its_own_evaluations(tmp_path, capsys):
    write_stage(tmp_path, "sft", {"a": (["x"], True)})
    write_stage(tmp_path, "round-1", {"a": (["x"], True)})
    write_stage(tmp_path, "sft", {"v": (["x"], False)}, split="evaluate-validation")
    write_stage(tmp_path, "round-1", {"v": (["y"], True)}, split="evaluate-validation")
    stage_diff.main([str(tmp_path), "sft", "round-1", "--split", "validation"])
    assert capsys.readouterr().out.strip() == (
        "sft -> round-1: 0/1 episodes identical; gained 1 ['v'], lost 0 []"
    )


def test_an_unknown_stage_names_the_stages_there(tmp_path, capsys):
    write_stage(tmp_path, "sft", {"a": (["x"], True)})
    with pytest.raises(SystemExit):
        stage_diff.main([str(tmp_path), "sft", "eto-round-9"])
    assert "evaluated: ['sft']" in capsys.readouterr().err


def test_failed_turns_count_only_trained_turns_answered_by_a_failure():
    from experiments import failed_turns
    from flywheel.records import Trajectory

    record = {
        "task_id": "t",
        "env": "textcraft",
        "episode_start": 0,
        "messages": [
            {"role": "user", "content": "goal"},
            {"role": "assistant", "content": "get 1 log", "loss": False},
            {"role": "user", "content": "Could not find log"},  # not trained: not counted
            {"role": "assistant", "content": "craft", "loss": True},
            {"role": "user", "content": "Could not find enough items"},
            {"role": "assistant", "content": "get 2 log", "loss": True},
            {"role": "user", "content": "Got 2 log"},
            {"role": "assistant", "content": "done", "loss": True},
        ],
    }
    assert failed_turns.failed_turns([Trajectory.model_validate(record)]) == (3, 1)
