"""The benches' reader of a run folder's record files."""

import pytest

from bench.run_files import read_records
from flywheel.records import Message, Trajectory


def _episode(task: str) -> Trajectory:
    messages = [Message(role="user", content="go")]
    return Trajectory(task_id=task, env="textcraft", messages=messages, episode_start=0)


def test_every_record_is_read_in_order_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    lines = [_episode("a").model_dump_json(), "", "  ", _episode("b").model_dump_json()]
    path.write_text("\n".join(lines) + "\n")
    assert [t.task_id for t in read_records(path, Trajectory)] == ["a", "b"]


def test_a_line_that_is_not_the_record_names_its_file_and_line(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text(_episode("a").model_dump_json() + "\n\n" + '{"task_id": 3}\n')
    with pytest.raises(ValueError, match=r"trajectories.jsonl, line 3: not a Trajectory record"):
        read_records(path, Trajectory)
