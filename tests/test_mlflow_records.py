"""What MLflow records of a run, read back from a real `mlflow server`: the resolved config
whole (`config.yaml`, which loads back to the config) and every setting as a param of its own,
never cut; a stage served from its manifest as a child run tagged `cached=true` with the key it
was served under; a failed stage's record linking the stage's own run."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
from prefect import flow
from pydantic import BaseModel

from flows.eto import ETOConfig
from flywheel.records import FailedStage, Manifest
from flywheel.stage import StageOutput, StageResult, StageRun, TrackingRef, stage
from flywheel.storage import ArtifactStore
from flywheel.tracking import CONFIG_ARTIFACT, Tracker, setting_params
from ops.runner import start_tracking
from ops.services import free_port, start_mlflow_server

# Fast: the flattening alone.


class Beta(BaseModel):
    beta: float = 0.1
    schedule: list[float] = [0.1, 0.2]


class Env(BaseModel):
    max_steps: int = 3
    servers: list[str] = []
    token_file: str | None = None


class Recipe(BaseModel):
    run_name: str = "r"
    dpo: Beta = Beta()
    env: Env = Env()
    weights: dict[str, float] = {"a": 0.5}
    notes: str = ""


def test_every_setting_is_a_param_named_by_its_path_and_lists_stay_json():
    assert setting_params(Recipe()) == {
        "run_name": "r",
        "dpo.beta": "0.1",
        "dpo.schedule": "[0.1, 0.2]",
        "env.max_steps": "3",
        "env.servers": "[]",
        "env.token_file": "null",
        "weights": '{"a": 0.5}',
        "notes": "",
    }


def test_a_value_longer_than_mlflow_keeps_says_where_it_is_and_is_never_cut():
    servers = [f"http://10.0.0.{i % 250}:{30000 + i}" for i in range(400)]
    params = setting_params(Recipe(env=Env(servers=servers)))
    assert len(json.dumps(servers)) > MAX_PARAM_VAL_LENGTH
    assert params["env.servers"] == (
        f"(in {CONFIG_ARTIFACT} only: {len(json.dumps(servers))} characters, over MLflow's "
        f"param limit of {MAX_PARAM_VAL_LENGTH})"
    )
    exactly_at_limit = "x" * MAX_PARAM_VAL_LENGTH
    assert setting_params(Recipe(notes=exactly_at_limit))["notes"] == exactly_at_limit


# Against a real server.


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory):
    home = tmp_path_factory.mktemp("mlflow")
    server = start_mlflow_server(home, str(home / "artifacts"), free_port())
    yield server.url
    server.stop()


def test_the_parent_run_holds_the_config_whole_and_each_setting_as_a_param(mlflow_url, tmp_path):
    long_list = [f"http://127.0.0.1:{30000 + i}" for i in range(300)]  # 7,800 characters
    cfg = ETOConfig(
        run_name="records",
        mlflow_tracking_uri=mlflow_url,
        mlflow_experiment="records",
        env={"servers": long_list, "max_steps": 7},
        dpo={"beta": 0.25},
    )
    parent = start_tracking(cfg, "flow-run-1").parent_run_id

    client = MlflowClient(mlflow_url)
    params = client.get_run(parent).data.params
    assert len(params) > 100  # more than one batch
    assert params == setting_params(cfg)
    assert (params["dpo.beta"], params["env.max_steps"]) == ("0.25", "7")
    assert params["env.servers"].startswith(f"(in {CONFIG_ARTIFACT} only: 7800 characters")
    saved = client.download_artifacts(parent, CONFIG_ARTIFACT, str(tmp_path))
    with open(saved) as file:
        assert ETOConfig.model_validate(yaml.safe_load(file)) == cfg


def test_a_param_too_long_for_mlflow_is_refused_not_cut(mlflow_url):
    tracker = Tracker(mlflow_url, "records")
    run_id = tracker.start("too-long")
    with pytest.raises(ValueError, match="'note' has 6001 characters"):
        tracker.log_params(run_id, {"note": "x" * (MAX_PARAM_VAL_LENGTH + 1)})
    assert tracker.client.get_run(run_id).data.params == {}


class WordInputs(BaseModel):
    text_url: str
    fail: bool = False


@stage("words")
def words_stage(inputs: WordInputs, run: StageRun) -> StageResult:
    text = run.store.read_text(inputs.text_url)
    if inputs.fail:
        raise ValueError("words.fail is set")
    url = run.store.write_text(run.file("words.txt"), "\n".join(text.split()))
    return StageResult(files={"words": url}, counts={"words": len(text.split())})


@pytest.fixture
def store(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    store.write_text(store.url("data/text.txt"), "a b c")
    store.publish(Manifest(stage="data", url=store.url("data")))
    return store


def flow_run(mlflow_url: str, name: str) -> TrackingRef:
    tracker = Tracker(mlflow_url, "stages")
    return TrackingRef(
        tracking_uri=mlflow_url, experiment="stages", parent_run_id=tracker.start(name)
    )


def stage_output(store: ArtifactStore, tracking: TrackingRef) -> StageOutput:
    return StageOutput(
        store_url=store.root, url=store.url("run/words"), label="r0", tracking=tracking
    )


def child_runs(client: MlflowClient, tracking: TrackingRef):
    experiment = client.get_experiment_by_name(tracking.experiment).experiment_id
    return client.search_runs([experiment], f"tags.mlflow.parentRunId = '{tracking.parent_run_id}'")


def test_a_served_stage_gets_a_child_run_tagged_cached_with_its_key(mlflow_url, store):
    inputs = WordInputs(text_url=store.url("data/text.txt"))
    first, second = flow_run(mlflow_url, "first"), flow_run(mlflow_url, "second")
    computed = words_stage.fn(inputs, stage_output(store, first))
    served = words_stage.fn(inputs, stage_output(store, second))
    assert served.served_from_store and not computed.served_from_store

    client = MlflowClient(mlflow_url)
    [ran], [cached] = child_runs(client, first), child_runs(client, second)
    assert ran.data.tags["cached"] == "false"
    assert cached.data.tags["cached"] == "true"
    key = computed.inputs_digest
    assert ran.data.tags["flywheel.stage_key"] == cached.data.tags["flywheel.stage_key"] == key
    assert cached.data.tags["flywheel.published_at"] == computed.published_at
    assert cached.data.metrics == ran.data.metrics == {"words": 3.0}
    assert cached.info.status == "FINISHED" and cached.info.run_name == "words/r0"


def test_a_failed_stages_record_links_the_stages_own_run(mlflow_url, store):
    tracking = flow_run(mlflow_url, "failing")
    out = StageOutput(
        store_url=store.root, url=store.url("run/words"), label="r1", tracking=tracking
    )

    @flow
    def one_stage():
        return words_stage(WordInputs(text_url=store.url("data/text.txt"), fail=True), out)

    assert one_stage(return_state=True).is_failed()
    record = FailedStage.model_validate_json(store.read_text(f"{out.url}/_FAILED.json"))
    [failed] = child_runs(MlflowClient(mlflow_url), tracking)
    assert record.mlflow_run.endswith(f"/runs/{failed.info.run_id}")
    assert (
        failed.info.status == "FAILED" and "words.fail is set" in failed.data.tags["flywheel.error"]
    )
