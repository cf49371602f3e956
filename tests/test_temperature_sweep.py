"""experiments/temperature_sweep.py reads a run's greedy and sampled evaluations and pairs two stages
sample by sample; checked on hand-written runs against hand-counted cells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.temperature_sweep import evaluation, main, row, sampled_inputs


def write_evaluation(folder: Path, played: list[tuple[str, bool]], temperature=None) -> None:
    folder.mkdir(parents=True)
    lines = [json.dumps({"task_id": task, "success": solved}) for task, solved in played]
    (folder / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    if temperature is not None:
        inputs = {"stage": "evaluate", "temperature": temperature, "samples_per_task": 2}
        (folder / "_MANIFEST.json").write_text(json.dumps({"key_inputs": inputs}))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    write_evaluation(run / "evaluate/start", [("a", True), ("b", False), ("c", False)])
    write_evaluation(run / "evaluate/trained", [("a", True), ("b", True), ("c", True)])
    # Two samples a task, a task's samples in sample order.
    write_evaluation(
        run / "evaluate-sampled/start",
        [("a", True), ("a", False), ("b", False), ("b", False), ("c", True), ("c", False)],
        temperature=1.0,
    )
    write_evaluation(
        run / "evaluate-sampled/trained",
        [("a", True), ("a", True), ("b", True), ("b", False), ("c", False), ("c", True)],
        temperature=1.0,
    )
    return run


def test_the_sampled_evaluation_is_read_per_sample_index(run):
    assert evaluation(run, "start", 1.0) == [
        {"a": True, "b": False, "c": True},
        {"a": False, "b": False, "c": False},
    ]
    assert evaluation(run, "trained", None) == [{"a": True, "b": True, "c": True}]


def test_the_two_stages_are_paired_cell_by_cell(run):
    # Greedy: b and c gained, nothing lost. Sampled: sample 0 gains b, loses c; sample 1
    # gains a and c.
    assert row([run], "start", "trained", None).startswith("| greedy | 3 | 1/3 | 3/3 | +2 -0 |")
    assert row([run], "start", "trained", 1.0).startswith("| 1 | 6 | 2/6 | 4/6 | +3 -1 |")
    # Two runs pool their cells.
    assert "| 12 | 4/12 | 8/12 | +6 -2 |" in row([run, run], "start", "trained", 1.0)


def test_a_run_without_sampled_episodes_is_refused_before_anything_plays(run, tmp_path):
    assert sampled_inputs(run, "start")["temperature"] == 1.0
    with pytest.raises(SystemExit, match="evaluate.samples"):
        main(["--runs", str(run), "--start", "start", "--stage", "missing", "--temperatures", "1"])
