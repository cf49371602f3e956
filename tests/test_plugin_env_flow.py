"""A recipe on an environment outside Flywheel's packages (examples/counter_env), named as
`package.module:Factory`. Real vLLM (CPU), real trl, real Prefect and MLflow, with the tiny
model."""

from __future__ import annotations

import json

import pytest

from flows.eto import eto
from flywheel.inference import release_vllm
from flywheel.records import Trajectory
from flywheel.storage import ArtifactStore

pytestmark = [pytest.mark.slow, pytest.mark.extended]


def tiny_eto(root, run_name: str, env: dict, rounds: int) -> dict:
    return {
        "run_name": run_name,
        "storage_url": str(root / "store"),
        "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "model": {"base": "tiny"},
        "env": {"train_tasks": 4, "test_tasks": 3, "max_steps": 3, "few_shot": 0, **env},
        "inference": {"max_tokens": 16, "kv_cache_gib": 1, "max_model_len": 2048},
        "rounds": rounds,
        "sft": {"epochs": 1, "batch_size": 2, "max_length": 1024},
        "dpo": {"epochs": 1, "max_length": 1024},
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("plugin-env")
    config = tiny_eto(
        root,
        "eto-counter",
        {"name": "examples.counter_env:CounterEnv", "options": {"largest_target": 4}},
        rounds=1,
    )
    try:
        state = eto(config=config, return_state=True)
    finally:
        release_vllm()
    return {"store": ArtifactStore(str(root / "store")), "state": state}


def test_a_recipe_runs_a_plugin_environment_end_to_end(run):
    """By `package.module:Factory`. A name from a package's entry point resolves to the same
    factory before any stage runs (tests/test_env_registry.py), so one flow shows both."""
    state = run["state"]
    assert state.is_completed(), state.message
    store = run["store"]
    rows = json.loads(store.read_text(store.url("eto-counter/results.json")))
    assert [row["stage"] for row in rows] == ["untrained", "sft", "eto-round-1"]
    experts = store.read_records(store.url("eto-counter/expert/expert.jsonl"), Trajectory)
    assert experts and {t.env for t in experts} == {"counter"}
    assert all(t.success for t in experts)  # the expert counts to every target
