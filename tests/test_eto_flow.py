"""The whole `eto` flow with the tiny model on object storage: a DPO failure, a resume at DPO, a
fully cached re-run from S3 alone, and a changed DPO setting that redoes exactly DPO and the
evaluation of its model.

Real TextCraft, real vLLM (CPU), real trl trainers in subprocesses, real Prefect (ephemeral
server), an S3 endpoint on loopback (moto's server) holding every artifact and manifest (the
stages' cache), and an MLflow server whose artifacts go to the same S3. The DPO failure is a real
one: a `max_length` no pair fits in.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
import s3fs
from conftest import flow_run_ids, task_states
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client

from flows.eto import ETO, ETOConfig, eto
from flywheel.inference import release_vllm
from flywheel.storage import ArtifactStore, cache_root
from ops.services import free_port, start_mlflow_server, start_s3
from ops.status import ReadOnlyStore, plan

pytestmark = pytest.mark.slow


SECRET = "flywheel-test-secret-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on loopback; credentials only in the standard AWS settings."""
    saved = {k: os.environ.get(k) for k in AWS_SETTINGS}
    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "flywheel-test", "AWS_SECRET_ACCESS_KEY": SECRET,
         "AWS_DEFAULT_REGION": "us-east-1"}
    )  # fmt: skip
    endpoint = start_s3(free_port())
    os.environ["AWS_ENDPOINT_URL"] = endpoint.url
    s3fs.S3FileSystem.clear_instance_cache()  # a cached client would keep an older endpoint
    mlflow = start_mlflow_server(
        tmp_path_factory.mktemp("mlflow"), "s3://flywheel/mlflow", free_port()
    )
    yield {"endpoint": endpoint.url, "mlflow": mlflow.url}
    mlflow.stop()
    endpoint.stop()
    s3fs.S3FileSystem.clear_instance_cache()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


AWS_SETTINGS = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
]


@pytest.fixture(scope="module")
def runs(s3, tiny_model_dir):
    config = {
        "run_name": "eto-tiny",
        "storage_url": "s3://flywheel/runs",
        "mlflow_tracking_uri": s3["mlflow"],
        "model": {"base": "tiny"},
        "env": {"train_tasks": 4, "test_tasks": 3, "max_steps": 3},
        "inference": {"max_tokens": 24, "kv_cache_gib": 1},
        "rounds": 1,  # round chaining is covered by the campaign in test_deployments.py
        "sft": {"epochs": 1, "batch_size": 2, "max_length": 1024},
        "dpo": {"epochs": 1, "max_length": 1024},
        "explore": {"shards": 2},
    }
    broken = {**config, "dpo": {**config["dpo"], "max_length": 64}}
    failed = eto(config=broken, return_state=True)
    resumed = eto(config=config, return_state=True)
    release_vllm()
    # Nothing local is left to serve the re-run: no downloaded copies, no local Prefect results.
    shutil.rmtree(cache_root() / "downloads", ignore_errors=True)
    shutil.rmtree(Path(os.environ["PREFECT_HOME"]) / "storage", ignore_errors=True)
    cached = eto(config=config, return_state=True)
    release_vllm()
    store = ArtifactStore(config["storage_url"])
    before = store.read_manifest(store.url("eto-tiny/evaluate/eto-round-1"))
    retuned_config = {**config, "dpo": {**config["dpo"], "beta": 0.5}}
    # What `flywheel status` says before the retuned run, from the store on S3 alone.
    status = plan(ETO, ETOConfig.model_validate(retuned_config), ReadOnlyStore(store.root))
    retuned = eto(config=retuned_config, return_state=True)
    release_vllm()
    return {
        "config": config, "failed": failed, "resumed": resumed, "cached": cached,
        "retuned": retuned, "evaluation_before": before, "status": status,
    }  # fmt: skip


def test_dpo_failure_fails_the_run_and_names_the_cause(runs):
    failed = runs["failed"]
    assert failed.is_failed()
    states = task_states(failed)
    assert states["dpo"] == ["Failed"]
    assert "no pair fits in max_length=64" in str(failed.message) + str(
        failed.result(raise_on_failure=False)
    )
    for stage in ["prepare-model", "expert-trajectories", "sft", "build-pairs"]:
        assert any(s in ("Completed", "Cached") for s in states[stage]), stage


def test_rerun_resumes_at_dpo(runs):
    resumed = runs["resumed"]
    assert resumed.is_completed()
    states = task_states(resumed)
    for stage in ["prepare-model", "expert-trajectories", "sft"]:
        assert states[stage] == ["Cached"], (stage, states[stage])
    # Round 1 up to its pairs was finished before the failure; its DPO runs now.
    assert states["explore-shard"] == ["Cached", "Cached"]
    assert states["build-pairs"] == ["Cached"]
    assert states["dpo"] == ["Completed"]
    labels = [row["stage"] for row in resumed.result()]
    assert labels == ["untrained", "sft", "eto-round-1"]


def test_second_run_is_entirely_cached_and_reports_the_same_table(runs):
    states = task_states(runs["cached"])
    assert {name: set(s) for name, s in states.items() if name != "report"} == {
        name: {"Cached"} for name in states if name != "report"
    }
    assert runs["cached"].result() == runs["resumed"].result()


def test_a_changed_setting_redoes_exactly_its_stage_and_what_used_its_output(runs):
    retuned = runs["retuned"]
    assert retuned.is_completed()
    states = task_states(retuned)
    assert states["dpo"] == ["Completed"]
    assert states["evaluate"] == ["Cached", "Cached", "Completed"]  # untrained, sft, round 1
    unchanged = ["prepare-model", "expert-trajectories", "sft", "explore-shard", "build-pairs"]
    for stage in unchanged:
        assert set(states[stage]) == {"Cached"}, (stage, states[stage])
    # The table's round-1 numbers are those of the retrained model, not the earlier one.
    store = ArtifactStore(runs["config"]["storage_url"])
    model_url = store.url("eto-tiny/round-1/dpo/model")
    evaluation = store.read_manifest(store.url("eto-tiny/evaluate/eto-round-1"))
    before = runs["evaluation_before"]
    assert evaluation.upstream[model_url] == store.content_digest(model_url)
    assert evaluation.upstream[model_url] != before.upstream[model_url]
    row = retuned.result()[-1]
    assert row["stage"] == "eto-round-1"
    assert row["success_rate"] == evaluation.metrics["success_rate"]


def test_status_named_the_changed_setting_before_the_run(runs):
    """`flywheel status` with the retuned config, before that run: DPO would re-run for its
    beta, the evaluation of its model after it; everything else cached."""
    found = {s.url.split("/eto-tiny/")[-1]: s for s in runs["status"]}
    rerun = {where for where, s in found.items() if s.state != "cached"}
    assert rerun == {"round-1/dpo", "evaluate/eto-round-1"}
    assert found["round-1/dpo"].reasons == ["setting settings.beta: 0.1 → 0.5"]
    [why] = found["evaluate/eto-round-1"].reasons
    assert why.endswith(
        "round-1/dpo/model: the stage at s3://flywheel/runs/eto-tiny/round-1/dpo re-runs first"
    )
    assert len(found) == 10  # base model, expert, sft, 2 shards, pairs, dpo, 3 evaluations


def test_results_reach_storage_mlflow_and_prefect_artifacts(runs):
    store = ArtifactStore(runs["config"]["storage_url"])
    run_url = store.url("eto-tiny")
    rows = json.loads(store.read_text(f"{run_url}/results.json"))
    assert [r["stage"] for r in rows] == ["untrained", "sft", "eto-round-1"]
    assert store.exists(f"{run_url}/success_rate.png")
    # Each stage paired with the stage it started from, on the split the report names.
    paired = json.loads(store.read_text(f"{run_url}/paired.json"))
    assert [(r["stage"], r["started_from"], r["tasks"]) for r in paired] == [
        ("sft", "untrained", 3), ("eto-round-1", "sft", 3),
    ]  # fmt: skip
    assert "Evaluated on the **test** split (3 tasks)." in store.read_text(f"{run_url}/results.md")
    for stage in ["expert", "sft", "round-1/pairs", "round-1/dpo", "evaluate/sft"]:
        assert store.manifest(f"{run_url}/{stage}") is not None, stage

    client = MlflowClient(runs["config"]["mlflow_tracking_uri"])
    experiment = client.get_experiment_by_name("flywheel")
    all_runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in all_runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 4  # one per flow run
    children = {r.data.tags["mlflow.runName"] for r in all_runs if r not in parents}
    assert {"sft/expert", "dpo/round-1", "evaluate/eto-round-1"} <= children
    # Every flow run has its sft/expert child; the first flow run's trained (later ones were
    # served from the store and log the manifest's numbers only).
    sft_runs = [r for r in all_runs if r.data.tags.get("mlflow.runName") == "sft/expert"]
    sft_run = min(sft_runs, key=lambda r: r.info.start_time)
    assert "train/loss" in sft_run.data.metrics or "loss" in sft_run.data.metrics  # trl's own
    last_parent = max(parents, key=lambda r: r.info.start_time)
    artifacts = {a.path for a in client.list_artifacts(last_parent.info.run_id)}
    assert {"results.md", "success_rate.png", "results.json", "paired.json"} <= artifacts

    with get_client(sync_client=True) as prefect:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        found = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["eto-tiny-report"]))
        )
    assert found and "eto-round-1" in found[0].data and "data:image/png;base64" in found[0].data


def test_stage_caches_are_checksummed_manifests_on_s3_and_nothing_is_pickled(runs):
    store = ArtifactStore("s3://flywheel/runs")
    sft = store.read_manifest(store.url("eto-tiny/sft"))
    assert "model/config.json" in sft.checksums and sft.inputs_digest and sft.code_version
    assert "model/training_args.bin" not in sft.checksums  # the Trainer's pickle stays out
    assert not store.list_files(store.url(".prefect-results"))
    assert not [u for u in store.list_files(store.root) if "prefect" in u]
    client = MlflowClient(runs["config"]["mlflow_tracking_uri"])
    experiment = client.get_experiment_by_name("flywheel")
    assert experiment.artifact_location.startswith("mlflow-artifacts:")  # proxied by the server
    assert ArtifactStore("s3://flywheel/mlflow").list_files("s3://flywheel/mlflow")


def test_credentials_never_reach_logs_artifacts_or_runs(runs):
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as prefect:
        ids = [
            i for s in ("failed", "resumed", "cached", "retuned")
            for i in flow_run_ids(prefect, runs[s].state_details.flow_run_id)
        ]  # fmt: skip
        logs = prefect.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))
        artifacts = prefect.read_artifacts()
        flow_runs = [prefect.read_flow_run(i) for i in ids]
    assert logs, "no logs were read"
    texts = [log.message for log in logs] + [str(a.data) for a in artifacts]
    texts += [json.dumps(r.parameters, default=str) for r in flow_runs]
    client = MlflowClient(runs["config"]["mlflow_tracking_uri"])
    experiment = client.get_experiment_by_name("flywheel")
    for run in client.search_runs([experiment.experiment_id]):
        texts += [json.dumps(run.data.params), json.dumps(run.data.tags)]
    store = ArtifactStore("s3://flywheel")
    objects = store.list_files("s3://flywheel")
    assert any(url.endswith("train.log") for url in objects)
    texts += [store.fs.cat_file(url).decode("utf-8", "replace") for url in objects]
    assert not [t for t in texts if SECRET in t]
