"""The `stage` decorator: a plain function of one inputs record, given the cache, the manifest,
the MLflow child run and the failure record."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from flywheel.records import FailedStage, Manifest
from flywheel.settings import EnvSettings
from flywheel.stage import StageOutput, StageResult, StageRun, TrackingRef, cache_inputs, stage
from flywheel.storage import ArtifactStore
from flywheel.tracking import Tracker


class CountInputs(BaseModel):
    text_url: str  # an artifact: keyed on its content
    repeat: int
    fail: bool = False


calls: list[CountInputs] = []


@stage("count")
def count_stage(inputs: CountInputs, run: StageRun) -> StageResult:
    calls.append(inputs)
    text = run.store.read_text(inputs.text_url) * inputs.repeat
    url = run.store.write_text(run.file("out.txt"), text)
    if inputs.fail:
        raise RuntimeError("the disk is full")
    return StageResult(files={"out": url}, counts={"chars": len(text)}, notes=["counted"])


@pytest.fixture
def store(tmp_path):
    calls.clear()
    store = ArtifactStore(str(tmp_path / "store"))
    publish_text(store, "abc")
    return store


def publish_text(store: ArtifactStore, text: str) -> None:
    """An upstream stage `data` that wrote `text.txt`."""
    store.write_text(store.url("data/text.txt"), text)
    store.publish(Manifest(stage="data", url=store.url("data")))


def test_the_body_runs_once_and_its_result_is_published_then_served(store):
    inputs = CountInputs(text_url=store.url("data/text.txt"), repeat=2)
    out = StageOutput(store_url=store.root, url=store.url("run/count"))
    first = count_stage.fn(inputs, out)
    assert (first.stage, first.url, first.counts, first.notes) == (
        "count", out.url, {"chars": 6}, ["counted"]
    )  # fmt: skip
    assert first.checksums["out.txt"].size == 6 and first.inputs_digest
    again = count_stage.fn(inputs, out)
    assert again.served_from_store and len(calls) == 1
    # A setting changes: the stage runs again; so it does when what it read changes.
    assert not count_stage.fn(inputs.model_copy(update={"repeat": 3}), out).served_from_store
    publish_text(store, "abcd")
    assert count_stage.fn(inputs, out).counts == {"chars": 8}
    assert len(calls) == 3


def test_a_redone_stage_starts_from_an_empty_folder_but_keeps_its_checkpoints(store):
    """Files an earlier attempt left (a stray optimizer state) are not published by the redo;
    a trainer's keyed checkpoints and a stage published below stay."""
    out = StageOutput(store_url=store.root, url=store.url("run/count"))
    store.write_text(f"{out.url}/optimizer.pt", "left by a killed attempt")
    store.write_text(f"{out.url}/checkpoint/step-2/_CHECKPOINT.json", "{}")
    store.write_text(f"{out.url}/inner/x.txt", "a stage of its own")
    store.publish(Manifest(stage="inner", url=f"{out.url}/inner"))
    done = count_stage.fn(CountInputs(text_url=store.url("data/text.txt"), repeat=1), out)
    assert "optimizer.pt" not in done.checksums and not store.exists(f"{out.url}/optimizer.pt")
    assert store.exists(f"{out.url}/checkpoint/step-2/_CHECKPOINT.json")
    assert store.exists(f"{out.url}/inner/x.txt") and store.read_manifest(f"{out.url}/inner")


def test_a_stage_served_from_its_manifest_drops_a_failure_record_left_after_it(store):
    """An attempt that failed before reading the cache (while keying, as a chaos run saw) left
    `_FAILED.json` in a published folder; serving the stage from its manifest removes it."""
    inputs = CountInputs(text_url=store.url("data/text.txt"), repeat=1)
    out = StageOutput(store_url=store.root, url=store.url("run/count"))
    count_stage.fn(inputs, out)
    store.write_text(f"{out.url}/_FAILED.json", "{}")
    assert count_stage.fn(inputs, out).served_from_store
    assert not store.exists(f"{out.url}/_FAILED.json")


def test_the_checkpoint_folder_a_redo_keeps_is_the_one_trainers_write():
    from flywheel.stage import KEPT_ON_REDO
    from training.checkpoint import checkpoint_plan

    class Run:
        store = ArtifactStore("/tmp/store")
        key = "k"

        def file(self, name):
            return f"file:///tmp/store/s/{name}"

    folder = checkpoint_plan(Run(), 5).url.rsplit("/", 1)[-1]
    assert folder in KEPT_ON_REDO


def test_the_key_is_the_stage_and_its_inputs_with_an_environment_as_its_identity():
    class EnvInputs(BaseModel):
        env: EnvSettings
        seed: int

    served = EnvSettings(servers=["http://127.0.0.1:36001"])
    keyed = cache_inputs("explore", EnvInputs(env=served, seed=3))
    assert keyed == {"stage": "explore", "env": EnvSettings().identity(), "seed": 3}
    assert cache_inputs("evaluate", EnvInputs(env=served, seed=3))["stage"] == "evaluate"


def test_a_failure_leaves_a_record_naming_the_inputs_and_the_child_run_failed(store, tmp_path):
    from prefect import flow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "stages")
    parent = tracker.start("run")
    tracking = TrackingRef(tracking_uri=uri, experiment="stages", parent_run_id=parent)
    inputs = CountInputs(text_url=store.url("data/text.txt"), repeat=1, fail=True)
    out = StageOutput(
        store_url=store.root, url=store.url("run/count"), label="r1", tracking=tracking
    )

    @flow
    def one_stage(inputs: CountInputs):
        return count_stage(inputs, out, return_state=True)

    client = MlflowClient(uri)

    def child_runs() -> list[tuple[str, str, float | None]]:
        runs = client.search_runs(
            [client.get_experiment_by_name("stages").experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent}'",
        )
        return [
            (r.data.tags["mlflow.runName"], r.info.status, r.data.metrics.get("chars"))
            for r in runs
        ]

    assert one_stage(inputs, return_state=True).is_failed()
    record = FailedStage.model_validate_json(store.read_text(f"{out.url}/_FAILED.json"))
    assert record.message == "RuntimeError: the disk is full"
    assert record.inputs == {"text_url": inputs.text_url}
    assert record.partial_outputs == [f"{out.url}/out.txt"]
    assert store.read_manifest(out.url) is None
    assert child_runs() == [("count/r1", "FAILED", None)]

    state = one_stage(inputs.model_copy(update={"fail": False}), return_state=True)
    assert state.is_completed() and not store.exists(f"{out.url}/_FAILED.json")
    assert child_runs() == [("count/r1", "FINISHED", 3.0)]  # the flow run's one run per stage
    assert one_stage(inputs.model_copy(update={"fail": False})).name == "Cached"


def test_markdown_is_published_inside_a_task_run_and_skipped_in_a_direct_call():
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flywheel.stage import publish_markdown

    @task
    def report(markdown: str, name: str) -> None:
        publish_markdown(markdown, f"s3://bucket/runs/{name}-behaviour", "the radar")

    @flow
    def reporting(name: str):
        report("# inside", name)

    report.fn("# direct", "Direct_Call")  # no run to attach it to
    reporting("ETO_Tiny")
    with get_client(sync_client=True) as client:
        found = {
            key: client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
            )
            for key in ("direct-call-behaviour", "eto-tiny-behaviour")
        }
    assert found["direct-call-behaviour"] == []
    assert [a.data for a in found["eto-tiny-behaviour"]] == ["# inside"]
