import pytest

from flywheel.records import Manifest, Message
from flywheel.storage import ArtifactStore


def test_stage_without_manifest_is_unfinished(tmp_path):
    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "explore")
    store.write_records(f"{stage}/trajectories.jsonl", [Message(role="user", content="hi")])
    assert store.manifest(stage) is None  # files alone do not make a finished stage
    store.publish(Manifest(stage="explore", url=stage, counts={"n": 1}))
    assert store.manifest(stage).counts == {"n": 1}
    assert store.read_records(f"{stage}/trajectories.jsonl", Message)[0].content == "hi"


def test_plain_paths_become_file_urls(tmp_path):
    assert ArtifactStore(str(tmp_path)).root == f"file://{tmp_path}"


def test_unwritable_store_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="storage_url"):
        ArtifactStore(str(blocker / "runs")).check_writable()


@pytest.fixture
def s3_store(tmp_path, monkeypatch):
    """A real S3 endpoint on loopback (moto's server) and a bucket in it."""
    import s3fs

    from flywheel.services import free_port, start_s3

    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FLYWHEEL_CACHE": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(key, value)
    server = start_s3(free_port(), home=tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached client would keep an older endpoint
    yield ArtifactStore("s3://flywheel/runs")
    server.stop()
    s3fs.S3FileSystem.clear_instance_cache()


def test_s3_round_trip_of_records_manifests_and_model_folders(s3_store, tmp_path):
    s3_store.check_writable()
    stage = s3_store.url("run", "sft")
    s3_store.write_records(f"{stage}/data.jsonl", [Message(role="user", content="hi")])
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    s3_store.upload_dir(model, f"{stage}/model")
    assert s3_store.manifest(stage) is None
    s3_store.publish(Manifest(stage="sft", url=stage, files={"model": f"{stage}/model"}))
    assert s3_store.manifest(stage).files["model"] == "s3://flywheel/runs/run/sft/model"
    local = s3_store.local_dir(f"{stage}/model")
    assert (local / "config.json").read_text() == "{}"
    assert (local / "sub" / "weights.bin").read_bytes() == b"\x00\x01"
    assert s3_store.local_file(f"{stage}/data.jsonl").read_text().startswith('{"role":"user"')


def test_a_stage_published_for_other_inputs_is_redone_not_reused(tmp_path):
    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "sft")
    old = {"settings": Message(role="user", content="epochs=2"), "model": "m"}
    store.publish(Manifest(stage="sft", url=stage), old)
    assert store.manifest(stage, old) is not None
    changed = {**old, "settings": Message(role="user", content="epochs=3")}
    assert store.manifest(stage, changed) is None
    # The stale manifest is gone: a crash while redoing the stage cannot revive it.
    assert store.manifest(stage, old) is None


def test_a_deleted_store_is_not_served_from_prefects_cache(tmp_path):
    import shutil

    from prefect import flow, task

    from flywheel.stage import STAGE_CACHE

    @task(cache_policy=STAGE_CACHE, persist_result=True)
    def write_stage(store_url: str, out_url: str) -> str:
        return ArtifactStore(store_url).write_text(f"{out_url}/data.txt", "finished")

    @flow
    def one_stage(store_url: str):
        return write_stage(
            store_url, ArtifactStore(store_url).url("run", "stage"), return_state=True
        )

    store_dir = tmp_path / "store"
    first = one_stage(str(store_dir))
    again = one_stage(str(store_dir))
    assert first.name == "Completed" and again.name == "Cached"
    shutil.rmtree(store_dir / "run")  # one run folder
    assert one_stage(str(store_dir)).name == "Completed"
    assert (store_dir / "run" / "stage" / "data.txt").read_text() == "finished"
    shutil.rmtree(store_dir)  # the whole store
    assert one_stage(str(store_dir)).name == "Completed"
    assert one_stage(str(store_dir)).name == "Cached"


def test_a_failed_stage_leaves_its_record_and_an_artifact_and_publishing_clears_it(tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flywheel.records import FailedStage
    from flywheel.stage import stage_task

    store = ArtifactStore(str(tmp_path / "store"))
    model = store.write_text(store.url("run", "sft", "model", "config.json"), "{}")

    @stage_task("half-done")
    def half_done(store_url: str, model_url: str, out_url: str, fail: bool) -> Manifest:
        s = ArtifactStore(store_url)
        s.write_text(f"{out_url}/part-0.jsonl", "{}\n")
        if fail:
            raise RuntimeError("the disk is full: free 2 GiB under /tmp and re-run")
        return s.publish(Manifest(stage="half-done", url=out_url))

    @flow
    def one_stage(fail: bool):
        return half_done(store.root, model, store.url("run", "half"), fail, return_state=True)

    assert one_stage(True, return_state=True).is_failed()
    record = FailedStage.model_validate_json(store.read_text(store.url("run/half/_FAILED.json")))
    assert record.message == "RuntimeError: the disk is full: free 2 GiB under /tmp and re-run"
    assert record.inputs == {"model_url": model}
    assert record.partial_outputs == [store.url("run/half/part-0.jsonl")]
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["run-failed-half-done"]))
        )
    assert found and model in found[-1].data and "disk is full" in found[-1].data

    assert one_stage(False, return_state=True).is_completed()
    assert not store.exists(store.url("run/half/_FAILED.json"))
