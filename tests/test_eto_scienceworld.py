"""`eto` on ScienceWorld with the tiny model, its episodes played on a Flywheel environment server.

Real ScienceWorld (Java), a real `python -m envs.agentgym.server` process, real vLLM (CPU), real trl, real
Prefect. The expert is ScienceWorld's own gold path; the tiny model solves nothing, so what is
checked is that every stage runs on the new environment and what it stores.
"""

from __future__ import annotations

import pytest

from envs.agentgym.server import LocalServer
from flows.eto import eto
from flywheel.inference import release_vllm
from flywheel.records import Trajectory
from flywheel.storage import ArtifactStore

pytestmark = [pytest.mark.slow, pytest.mark.extended]

ENV = {
    "name": "scienceworld",
    "scienceworld": {"task_names": ["lifespan-longest-lived"], "variations": 3},
    "train_tasks": 2,
    "test_tasks": 2,
    "max_steps": 3,
    "few_shot": 0,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("eto-sw")
    served = root / "served.yaml"
    served.write_text(
        "env:\n  name: scienceworld\n  scienceworld:\n"
        "    task_names: [lifespan-longest-lived]\n    variations: 3\n"
    )
    server = LocalServer("--config", str(served))
    config = {
        "run_name": "eto-sw",
        "storage_url": str(root / "store"),
        "mlflow_tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "model": {"base": "tiny"},
        "env": {**ENV, "servers": [server.url]},
        "inference": {"max_tokens": 16, "kv_cache_gib": 1},
        "rounds": 1,
        "sft": {"epochs": 1, "batch_size": 2, "max_length": 2048},
        "dpo": {"epochs": 1, "max_length": 2048},
        "explore": {"shards": 1},
    }
    try:
        state = eto(config=config, return_state=True)
    finally:
        release_vllm()
        server.kill()
    return {"state": state, "store": ArtifactStore(config["storage_url"])}


def test_eto_runs_on_scienceworld_through_a_server(run):
    assert run["state"].is_completed(), run["state"].message
    rows = run["state"].result()
    assert [r["stage"] for r in rows] == ["untrained", "sft", "eto-round-1"]

    store = run["store"]
    url = store.url("eto-sw")
    expert = store.read_records(f"{url}/expert/expert.jsonl", Trajectory)
    assert len(expert) == 2 and all(t.success and t.env == "scienceworld" for t in expert)
    assert all(t.task_id.startswith("lifespan-longest-lived/") for t in expert)
    assert expert[0].messages[expert[0].episode_start].content.startswith("Your task is to")

    explore = store.manifest(f"{url}/round-1/explore/shard-0")
    assert explore.counts["episodes"] == 2 and explore.counts["retried"] == 0
    explored = store.read_records(explore.files["trajectories"], Trajectory)
    assert {t.task_id for t in explored} == {t.task_id for t in expert}
    assert all(t.finish_reason in ("done", "max_steps", "context") for t in explored)
