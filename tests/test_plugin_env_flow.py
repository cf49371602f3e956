"""A recipe on an environment outside Flywheel's packages (examples/counter_env), named two ways:
`package.module:Factory` and a package's entry point. Real vLLM (CPU), real trl, real Prefect
and MLflow, with the tiny model."""

from __future__ import annotations

import json
import sys

import pytest

from flows.eto import eto
from flywheel.inference import release_vllm
from flywheel.records import Trajectory
from flywheel.storage import ArtifactStore

pytestmark = pytest.mark.slow


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
def runs(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("plugin-env")
    by_factory = tiny_eto(
        root,
        "eto-counter",
        {"name": "examples.counter_env:CounterEnv", "options": {"largest_target": 4}},
        rounds=1,
    )
    plugin = root / "site"
    info = plugin / "counter_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: counter-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[flywheel.environments]\ncounter = examples.counter_env:CounterEnv\n"
    )
    by_entry_point = tiny_eto(root, "eto-counter-ep", {"name": "counter"}, rounds=0)
    sys.path.insert(0, str(plugin))
    try:
        states = {
            "factory": eto(config=by_factory, return_state=True),
            "entry_point": eto(config=by_entry_point, return_state=True),
        }
    finally:
        sys.path.remove(str(plugin))
        release_vllm()
    return {"store": ArtifactStore(str(root / "store")), "states": states}


@pytest.mark.parametrize(
    "how, run, rounds", [("factory", "eto-counter", 1), ("entry_point", "eto-counter-ep", 0)]
)
def test_a_recipe_runs_a_plugin_environment_end_to_end(runs, how, run, rounds):
    state = runs["states"][how]
    assert state.is_completed(), state.message
    store = runs["store"]
    rows = json.loads(store.read_text(store.url(f"{run}/results.json")))
    rounds_run = [f"eto-round-{n}" for n in range(1, rounds + 1)]
    assert [row["stage"] for row in rows] == ["untrained", "sft", *rounds_run]
    experts = store.read_records(store.url(f"{run}/expert/expert.jsonl"), Trajectory)
    assert experts and {t.env for t in experts} == {"counter"}
    assert all(t.success for t in experts)  # the expert counts to every target
