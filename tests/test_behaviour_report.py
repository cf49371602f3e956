"""The behaviour report of evaluated policies: the rule-judged conciseness, the radar's axes, the
table, the files it writes."""

from __future__ import annotations

import json

import pytest

from agents.formats import make_format
from flywheel.records import Manifest, Message, Trajectory
from flywheel.storage import ArtifactStore
from tasks.behaviour_report import (
    behaviour_report,
    behaviour_table,
    policy_behaviour,
    radar_values,
    repeats_a_call,
)

TAGS = make_format("tags")


def episode(*turns: str, success: bool = False) -> Trajectory:
    """Agent turns given as text; each call is followed by its result ("Error: ..." for an
    error when the turn ends with '!')."""
    messages = [Message(role="system", content="s"), Message(role="user", content="q")]
    for turn in turns:
        failed = turn.endswith("!")
        messages.append(
            Message(role="assistant", content=turn.rstrip("!"), token_ids=[1] * 5, loss=True)
        )
        if not turn.startswith("<answer>"):
            result = "Error: bad call" if failed else "a result"
            messages.append(TAGS.result_message(result))
    return Trajectory(task_id="t", env="qa", messages=messages, episode_start=1, success=success)


REPEATS = episode(
    "<search>a</search>", "<search>b</search>", "<search>a</search>", "<answer>x</answer>"
)
CLEAN = episode(
    "<search>a</search>", "<python>print(1)</python>!", "<answer>y</answer>", success=True
)


def test_a_repeated_call_with_the_same_arguments_is_redundant():
    assert repeats_a_call(REPEATS, TAGS)
    assert not repeats_a_call(CLEAN, TAGS)
    # the same words in another tool are not a repeat
    assert not repeats_a_call(episode("<search>1</search>", "<python>1</python>"), TAGS)


def test_policy_behaviour_counts_by_hand():
    got = policy_behaviour([REPEATS, CLEAN], TAGS)
    assert got["episodes"] == 2 and got["solved"] == 1
    assert got["correctness"] == 0.5
    assert got["tool_calls"] == 5 and got["tool_errors"] == 1
    assert got["efficiency"] == pytest.approx(1 / 5)
    assert got["calls_per_correct_answer"] == 5.0
    assert got["conciseness"] == 0.5  # CLEAN only
    assert got["successful_execution"] == pytest.approx(4 / 5)
    assert got["reasoning_length"] == pytest.approx((4 * 5 + 3 * 5) / 2)
    assert policy_behaviour([REPEATS], TAGS)["calls_per_correct_answer"] is None


def test_radar_values_put_every_axis_on_zero_to_one():
    rows = [
        {"correctness": 0.5, "efficiency": 0.25, "conciseness": 1.0,
         "successful_execution": 0.8, "reasoning_length": 20.0},
        {"correctness": 0.1, "efficiency": None, "conciseness": None,
         "successful_execution": None, "reasoning_length": 40.0},
    ]  # fmt: skip
    assert radar_values(rows) == [[0.5, 0.25, 1.0, 0.8, 1.0], [0.1, 0.0, 0.0, 0.0, 0.5]]


def test_the_table_shows_n_and_an_interval():
    rows = [{"stage": "rft", **policy_behaviour([REPEATS, CLEAN], TAGS)}]
    table = behaviour_table(rows)
    assert "| rft | 50.0% (9.5%–90.5%, 1/2) | 0.200 | 5.0 | 50.0% | 80.0% | 17.5 |" in table
    assert "rule-based" in table


def test_the_report_writes_its_files_and_logs_them_to_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    from flywheel.stage import TrackingRef
    from flywheel.tracking import Tracker

    store = ArtifactStore(f"file://{tmp_path}")
    data = store.write_records(store.url("run", "evaluate", "rft", "t.jsonl"), [REPEATS, CLEAN])
    evaluation = Manifest(stage="evaluate", url=store.url("run", "evaluate", "rft"),
                          files={"trajectories": data})  # fmt: skip
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = Tracker(uri, "flywheel").start("flow")
    rows = behaviour_report.fn(
        store_url=store.root, run_url=store.url("run"), title="t", evaluations=[("rft", evaluation)],
        agent_format="tags", tool_arguments={},
        tracking=TrackingRef(tracking_uri=uri, experiment="flywheel", parent_run_id=parent),
    )  # fmt: skip
    assert [r["stage"] for r in rows] == ["rft"]
    assert json.loads(store.read_text(store.url("run", "behaviour.json")))[0]["solved"] == 1
    assert (tmp_path / "run" / "radar.png").read_bytes()[:4] == b"\x89PNG"
    client = MlflowClient(uri)
    assert {a.path for a in client.list_artifacts(parent)} == {"behaviour.md", "radar.png"}
    history = client.get_metric_history(parent, "behaviour/correctness")
    assert [(m.step, m.value) for m in history] == [(0, 0.5)]
