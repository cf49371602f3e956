"""ET-Agent end to end with the tiny model: warm start, data evolution, curriculum stage, reports.

Real QA environment, real vLLM (CPU), the trainers in their own processes, real Prefect and
MLflow. The tiny random model never answers right, so data evolution keeps nothing (RFT is skipped
and said so) and the curriculum stage finds no group with both a success and a failure (said
so, and the rounds stop); the behaviour report still measures every evaluated policy.
"""

from __future__ import annotations

import json

import pytest
from conftest import task_states, tiny_tool_recipe

from flows.et_agent import et_agent
from flywheel.inference import release_vllm
from flywheel.storage import ArtifactStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("et-agent")
    config = tiny_tool_recipe("et-agent-tiny", root, evolve_tasks=2, evolve={"rounds": 1})
    state = et_agent(config=config, return_state=True)
    release_vllm()
    return {"config": config, "state": state}


def test_the_flow_runs_every_stage_and_says_why_it_stopped(run):
    state, config = run["state"], run["config"]
    assert state.is_completed()
    states = task_states(state)
    for stage in ["expert-trajectories", "sft", "evaluate", "evolve", "sample", "calibrate"]:
        assert set(states[stage]) <= {"Completed"}, (stage, states[stage])
    assert "rl" not in states  # no mixed group: nothing to calibrate on
    assert [row["stage"] for row in state.result()] == ["warm-start", "rft"]
    store = ArtifactStore(config["storage_url"])
    notes = store.read_text(store.url("et-agent-tiny/results.md"))
    assert "data evolution kept no correct trajectory" in notes
    assert "no sampled group had both a success and a failure" in notes
    behaviour = json.loads(store.read_text(store.url("et-agent-tiny/behaviour.json")))
    assert [row["stage"] for row in behaviour] == ["warm-start", "rft"]
    assert all(row["episodes"] == 2 for row in behaviour)
    assert store.exists(store.url("et-agent-tiny/radar.png"))
