"""`task_runner: dask`: exploration shards run on a Dask cluster of separate worker processes
(a real LocalCluster, real vLLM in each worker), and land in the store like any other run's."""

from __future__ import annotations

import os

import pytest
from prefect import flow

from agents.rollout import agent_prefix
from envs import make_env
from flows.eto import ETOConfig
from flywheel.records import Trajectory
from flywheel.stage import StageOutput
from flywheel.storage import ArtifactStore
from ops.runner import run_tracked, share_prefect_api
from tasks.explore import ExploreInputs, explore_stage, shard

pytestmark = [pytest.mark.slow, pytest.mark.extended]


def explore_shards(cfg: ETOConfig, store, tracking, model_url: str) -> list:
    env = make_env(cfg.env)
    task_ids = env.task_ids("train")[:2]
    shards = shard(task_ids, 2, 1)
    return explore_stage.map(
        [
            ExploreInputs(
                model_url=model_url, env=cfg.env, task_ids=tasks, prefix=agent_prefix(env, []),
                inference=cfg.inference, temperature=cfg.explore.temperature,
                max_steps=cfg.env.max_steps, seed=seed,
            )
            for seed, tasks in enumerate(shards, 1)
        ],
        [StageOutput(store_url=store.root, url=store.url("dask", f"shard-{i}")) for i in range(2)],
    ).result()  # fmt: skip


@flow(name="explore-on-dask")
def explore_on_dask(config: dict, model_url: str):
    return run_tracked(ETOConfig.model_validate(config), explore_shards, model_url)


@pytest.fixture(scope="module")
def cluster():
    import dask
    from distributed import Client, LocalCluster

    # Each worker's vLLM engine in the worker process itself: one process start and vLLM import
    # less per shard (~1 min of this test on 2 cores); the engine is the same.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    share_prefect_api()  # as a user's workers get PREFECT_API_URL: this process's API
    with (
        # As a user's `dask worker` would run: vLLM starts its engine in a child process.
        dask.config.set({"distributed.worker.daemon": False}),
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as local,
        Client(local) as client,
    ):
        yield local, client
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")


def test_exploration_shards_run_on_dask_worker_processes(cluster, tmp_path, tiny_model_dir):
    from distributed import get_task_stream

    local, client = cluster
    config = {
        "run_name": "dask", "storage_url": str(tmp_path / "store"),
        "task_runner": "dask", "task_runner_address": local.scheduler_address,
        "model": {"base": "tiny"}, "env": {"train_tasks": 2, "test_tasks": 1, "max_steps": 2},
        "inference": {"max_tokens": 16, "kv_cache_gib": 1},
    }  # fmt: skip
    with get_task_stream(client) as stream:
        manifests = explore_on_dask(config, f"file://{tiny_model_dir}")
    worker_pids = client.run(os.getpid)
    assert os.getpid() not in worker_pids.values()
    ran_on = {entry["worker"] for entry in stream.data}
    assert ran_on and ran_on <= set(worker_pids), "the shards did not run on the cluster"
    assert len(manifests) == 2
    store = ArtifactStore(config["storage_url"])
    episodes = [
        t for m in manifests for t in store.read_records(m.files["trajectories"], Trajectory)
    ]
    assert len(episodes) == 2 and all(t.n_steps > 0 for t in episodes)
