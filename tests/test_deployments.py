"""Deployments for real: a Prefect server and a process worker started by the test, the shipped
`deployments/prefect.yaml` deployed with `prefect deploy`, runs started with `prefect deployment
run`, and everything read back through the Prefect API, the artifact store and MLflow.

The ETO campaign with the tiny model: round 0 (SFT), a run that fails at DPO while the first still
holds the campaign (it waits, then fails: a real trl failure, no pair fits in max_length=64), a
run that resumes and publishes round 1, and a run with nothing left to do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import flow_run_ids, task_states
from mlflow.tracking import MlflowClient

from flywheel.storage import ArtifactStore
from ops.services import free_port, start_prefect_server

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DEPLOYMENT = "eto-campaign/eto-campaign-textcraft"


@pytest.fixture(scope="module")
def prefect(tmp_path_factory, tiny_model_dir):
    """A Prefect server (its scheduler off: the test starts every run) and a process worker."""
    home = tmp_path_factory.mktemp("prefect-server")
    server = start_prefect_server(
        home, free_port(), env={"PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false"}
    )
    env = {
        **os.environ,
        "PREFECT_API_URL": f"{server.url}/api",
        "PREFECT_HOME": str(home / "client"),
        "FLYWHEEL_HOME": str(REPO),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }

    def cli(*args: str) -> str:
        done = subprocess.run(
            [str(REPO / ".venv/bin/prefect"), *args], cwd=REPO, env=env, text=True,
            capture_output=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    cli("work-pool", "create", "flywheel-process", "--type", "process")
    cli("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml",
        "--name", "eto-campaign-textcraft")  # fmt: skip
    with open(home / "worker.log", "w") as log:
        worker = subprocess.Popen(
            [str(REPO / ".venv/bin/prefect"), "worker", "start", "--pool", "flywheel-process"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # This process's Prefect client talks to the test's server, not the ephemeral one.
    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        yield {"cli": cli, "env": env, "home": home, "worker_log": home / "worker.log"}
    worker.terminate()
    try:
        worker.wait(60)
    except subprocess.TimeoutExpired:  # a loaded machine: the graceful SIGTERM path is slow
        worker.kill()
        worker.wait(10)
    server.stop()


def overrides(store: Path, *extra: str) -> list[str]:
    return [
        "run_name=campaign-tiny", f"storage_url={store}", "model.base=tiny", "rounds=1",
        "env.train_tasks=4", "env.test_tasks=2", "env.max_steps=3",
        "inference.max_tokens=24", "inference.kv_cache_gib=1", "explore.shards=2",
        "sft.epochs=1", "sft.batch_size=2", "sft.max_length=1024", "sft.frozen_layers=0",
        "dpo.epochs=1", "dpo.max_length=1024", "dpo.frozen_layers=0", *extra,
    ]  # fmt: skip


def start_run(prefect, params: dict) -> str:
    out = prefect["cli"]("deployment", "run", DEPLOYMENT, "--params", json.dumps(params))
    return re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)


def read_run(run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def wait_for(run_id: str, prefect, final: bool = True, timeout_s: float = 900):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = read_run(run_id)
        if (run.state.is_final() if final else run.state.is_running()) and (
            not final or run.end_time
        ):
            return run
        time.sleep(1)
    raise AssertionError(f"run {run_id} stuck: worker log:\n{prefect['worker_log'].read_text()}")


def stage_runs(run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    with get_client(sync_client=True) as client:
        ids = flow_run_ids(client, run_id)
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": ids}))


def latest_artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return max(found, key=lambda a: a.created) if found else None


def failure_artifact(key: str):
    """The latest version of a failure artifact that records the failure: a later run that
    succeeded published a newer one saying it is superseded."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    failures = [a for a in found if not str(a.data).startswith("# Superseded")]
    return max(failures, key=lambda a: a.created) if failures else None


@pytest.fixture(scope="module")
def campaign(prefect, tmp_path_factory):
    store = tmp_path_factory.mktemp("campaign") / "store"
    good = {"config_file": "configs/eto_textcraft.yaml", "overrides": overrides(store)}
    broken = {**good, "overrides": overrides(store, "dpo.max_length=64")}
    first = start_run(prefect, good)
    # The first run holds the campaign once its stages subflow exists; start the second then.
    deadline = time.monotonic() + 600
    while len(flow_run_ids_of(first)) < 2 and time.monotonic() < deadline:
        assert not read_run(first).state.is_final(), read_run(first).state.message
        time.sleep(1)
    second = start_run(prefect, broken)
    runs = {"first": wait_for(first, prefect), "second": wait_for(second, prefect)}
    store_obj = ArtifactStore(str(store))
    failed_record = store_obj.url("campaign-tiny", "round-1", "dpo", "_FAILED.json")
    runs["failed_record_after_second"] = (
        json.loads(store_obj.read_text(failed_record)) if store_obj.exists(failed_record) else None
    )
    runs["state_after_second"] = json.loads(
        store_obj.read_text(store_obj.url("campaign-tiny", "campaign.json"))
    )
    runs["third"] = wait_for(start_run(prefect, good), prefect)
    runs["fourth"] = wait_for(start_run(prefect, good), prefect)
    runs["store"] = store_obj
    runs["mlflow"] = prefect["env"]["MLFLOW_TRACKING_URI"]
    return runs


def flow_run_ids_of(run_id: str) -> list:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return flow_run_ids(client, run_id)


def test_deploy_declares_the_campaign_with_its_schedule_and_parameters(prefect):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
    assert deployment.work_pool_name == "flywheel-process"
    assert deployment.parameters["config_file"] == "configs/eto_textcraft.yaml"
    assert [s.schedule.cron for s in deployment.schedules] == ["0 */6 * * *"]


def test_first_run_publishes_round_zero(campaign):
    first = campaign["first"]
    assert first.state.is_completed(), first.state.message
    assert "published round 0" in first.state.message
    assert [r["round"] for r in campaign["state_after_second"]["rounds"]] == [0]


def test_a_second_run_waits_for_the_first_instead_of_overlapping(campaign):
    first_end = campaign["first"].end_time
    stages = [r for r in stage_runs(campaign["second"].id) if r.start_time]
    assert stages, "the second run ran no stage"
    assert min(r.start_time for r in stages) >= first_end


def test_a_failed_stage_is_readable_through_the_prefect_api(campaign):
    second = campaign["second"]
    assert second.state.is_failed()
    assert "no pair fits in max_length=64" in second.state.message
    states = task_states(second.id)
    assert states["dpo"] == ["Failed"]
    assert set(states["explore-shard"]) == {"Completed"} and states["build-pairs"] == ["Completed"]

    stage_artifact = failure_artifact("campaign-tiny-failed-dpo")
    assert stage_artifact is not None and "no pair fits in max_length=64" in stage_artifact.data
    record = campaign["failed_record_after_second"]
    assert record["stage"] == "dpo" and "max_length=64" in record["message"]
    store = campaign["store"]
    inputs = record["inputs"]
    for url in [inputs["model_url"], *inputs["pairs_urls"]]:  # the failed stage's inputs stay
        assert store.exists(url) and url in stage_artifact.data
    assert any(url.endswith("train.log") for url in record["partial_outputs"])

    run_artifact = failure_artifact("campaign-tiny-failed")
    assert run_artifact is not None and "round-1/dpo/_FAILED.json" in run_artifact.data
    mlflow_run_id = re.search(r"/runs/([0-9a-f]+)", run_artifact.data).group(1)
    mlflow = MlflowClient(campaign["mlflow"])
    parent = mlflow.get_run(mlflow_run_id)
    assert parent.info.status == "FAILED"
    assert "max_length=64" in parent.data.tags["flywheel.error"]
    # A failed run publishes nothing: the campaign still ends at round 0.
    assert [r["round"] for r in campaign["state_after_second"]["rounds"]] == [0]


def test_the_next_run_resumes_the_round_and_publishes_it(campaign):
    third = campaign["third"]
    assert third.state.is_completed(), third.state.message
    assert "published round 1" in third.state.message
    states = task_states(third.id)
    assert set(states["explore-shard"]) == {"Cached"} and states["build-pairs"] == ["Cached"]
    assert states["dpo"] == ["Completed"]
    store = campaign["store"]
    state = json.loads(store.read_text(store.url("campaign-tiny", "campaign.json")))
    assert [r["round"] for r in state["rounds"]] == [0, 1]
    assert state["rounds"][1]["policy"].endswith("round-1/dpo/model")
    assert not store.exists(store.url("campaign-tiny", "round-1", "dpo", "_FAILED.json"))
    for key in ("campaign-tiny-failed-dpo", "campaign-tiny-failed"):  # the UI's latest version
        assert latest_artifact(key).data.startswith("# Superseded: "), key


def test_a_run_with_nothing_new_ends_cleanly_without_stages(campaign):
    fourth = campaign["fourth"]
    assert fourth.state.is_completed()
    assert "nothing new to do" in fourth.state.message
    assert stage_runs(fourth.id) == []
