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
    # The stale result left the stage's folder (a crash while redoing the stage cannot revive
    # it as the new key's) and is kept under its own key.
    assert store.read_manifest(stage) is None
    assert set(store.variants(stage)) == {store.stage_key(old)[0]}


def test_a_stage_is_served_from_its_manifest_as_cached_until_its_folder_is_deleted(tmp_path):
    import shutil

    from prefect import flow

    from flywheel.stage import stage_task

    @stage_task("write")
    def write_stage(store_url: str, out_url: str) -> Manifest:
        store = ArtifactStore(store_url)
        if (done := store.manifest(out_url, {"text": "finished"})) is not None:
            return done
        store.write_text(f"{out_url}/data.txt", "finished")
        return store.publish(Manifest(stage="write", url=out_url), {"text": "finished"})

    @flow
    def one_stage(store_url: str):
        return write_stage(
            store_url, ArtifactStore(store_url).url("run", "stage"), return_state=True
        )

    store_dir = tmp_path / "store"
    first = one_stage(str(store_dir))
    again = one_stage(str(store_dir))
    assert (first.name, again.name) == ("Completed", "Cached")
    assert again.result().checksums["data.txt"].size == len("finished")

    @flow
    def called_directly(store_url: str):
        return write_stage(store_url, ArtifactStore(store_url).url("run", "stage"))

    assert isinstance(called_directly(str(store_dir)), Manifest)  # a value, not the state
    shutil.rmtree(store_dir / "run")  # one run folder
    assert one_stage(str(store_dir)).name == "Completed"
    assert (store_dir / "run" / "stage" / "data.txt").read_text() == "finished"
    # Outside a task run the plain function returns the manifest, cached or not.
    store = ArtifactStore(str(store_dir))
    assert write_stage.fn(store.root, store.url("run", "stage")).served_from_store


def publish_file(
    store: ArtifactStore, stage_url: str, name: str, text: str, inputs=None, code=None
):
    store.write_text(f"{stage_url}/{name}", text)
    return store.publish(Manifest(stage=stage_url.rsplit("/", 1)[-1], url=stage_url), inputs, code)


def test_a_stage_is_keyed_on_the_content_it_read_not_the_url(tmp_path):
    store = ArtifactStore(str(tmp_path))
    upstream, downstream = store.url("run", "sft"), store.url("run", "evaluate")
    publish_file(store, upstream, "model/weights.bin", "epochs=2")
    inputs = {"model": f"{upstream}/model", "episodes": 3}
    publish_file(store, downstream, "results.json", "{}", inputs)
    assert store.manifest(downstream, inputs) is not None
    # The upstream stage is redone at the same URL with other content: its readers are stale.
    publish_file(store, upstream, "model/weights.bin", "epochs=3")
    assert store.manifest(downstream, inputs) is None
    found = publish_file(store, downstream, "results.json", "{}", inputs)
    assert found.upstream == {f"{upstream}/model": store.content_digest(f"{upstream}/model")}
    # Files of the upstream stage that the reader did not name do not change its key.
    store.write_text(f"{upstream}/train.log", "another log")
    publish_file(store, upstream, "model/weights.bin", "epochs=3")
    assert store.manifest(downstream, inputs) is not None


def test_a_change_to_the_stage_code_redoes_the_stage(tmp_path):
    from flywheel.code_version import StageCode

    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "pairs")
    code = StageCode({"tasks.build_pairs": "a1"}, {"trl": "1.0"})
    publish_file(store, stage, "pairs.jsonl", "", {"extra_turns": 5}, code)
    assert store.manifest(stage, {"extra_turns": 5}, code) is not None
    edited = StageCode({"tasks.build_pairs": "b2"}, {"trl": "1.0"})
    assert store.manifest(stage, {"extra_turns": 5}, edited) is None


@pytest.mark.parametrize(
    "damage",
    ["cut mid-line", "last line missing", "1 MiB overwritten", "deleted"],
)
def test_damaged_outputs_are_redone_and_damaged_inputs_are_refused(tmp_path, damage, capsys):
    from flywheel.storage import CorruptArtifact

    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "explore")
    lines = "".join(
        Message(role="user", content=f"line {i}").model_dump_json() + "\n" for i in range(3)
    )
    store.write_text(f"{stage}/trajectories.jsonl", lines)
    weights = tmp_path / "run" / "explore" / "model" / "weights.bin"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    store.publish(Manifest(stage="explore", url=stage), {"seed": 1})
    path = tmp_path / "run" / "explore" / "trajectories.jsonl"
    damaged = path
    if damage == "cut mid-line":
        path.write_text(lines[: len(lines) - 20])
    elif damage == "last line missing":
        path.write_text("".join(lines.splitlines(keepends=True)[:2]))
    elif damage == "1 MiB overwritten":
        damaged = weights
        with open(weights, "r+b") as f:
            f.write(b"\0" * (1 << 20))
    else:
        damaged = weights
        weights.unlink()
    name = f"{stage}/{damaged.relative_to(tmp_path / 'run' / 'explore').as_posix()}"

    # A reader of the damaged file is refused, naming the file and the stage that wrote it...
    with pytest.raises(CorruptArtifact, match=f"{name}.*stage 'explore'"):
        if damaged == weights:
            store.local_dir(f"{stage}/model")
        else:
            store.read_records(f"{stage}/trajectories.jsonl", Message)
    # ... and the stage is redone by the next run instead of being reused.
    assert store.manifest(stage, {"seed": 1}) is None

    # The same on a cache hit: the stage itself notices, says why, and is redone.
    store.write_text(f"{stage}/trajectories.jsonl", lines)
    weights.write_bytes(bytes(range(256)) * 8192)
    store.publish(Manifest(stage="explore", url=stage), {"seed": 1})
    weights.write_bytes(b"short")
    assert store.manifest(stage, {"seed": 1}) is None
    assert f"{stage}/model/weights.bin has 5 bytes" in capsys.readouterr().out


def test_a_broken_record_names_its_file_and_line(tmp_path):
    from flywheel.storage import CorruptArtifact

    store = ArtifactStore(str(tmp_path))
    url = store.write_text(store.url("data.jsonl"), '{"role": "user", "content": "a"}\n{"role": \n')
    with pytest.raises(CorruptArtifact, match=r"data.jsonl, line 2: not a Message record"):
        store.read_records(url, Message)


def test_a_stage_redone_at_the_same_url_is_not_read_from_an_old_local_copy(tmp_path, monkeypatch):
    """Remote stores are read through local copies; a copy holds one content, never a URL's."""
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    store = ArtifactStore(f"memory://{tmp_path.name}/store")
    stage = store.url("run", "sft")
    publish_file(store, stage, "model/config.json", '{"epochs": 2}')
    assert (store.local_dir(f"{stage}/model") / "config.json").read_text() == '{"epochs": 2}'
    assert store.read_json(f"{stage}/model/config.json") == {"epochs": 2}
    publish_file(store, stage, "model/config.json", '{"epochs": 3}')  # redone, same URL
    assert (store.local_dir(f"{stage}/model") / "config.json").read_text() == '{"epochs": 3}'
    assert store.read_json(f"{stage}/model/config.json") == {"epochs": 3}
    assert store.local_file(f"{stage}/model/config.json").read_text() == '{"epochs": 3}'


def test_a_damaged_remote_file_is_caught_when_copied_here(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    store = ArtifactStore(f"memory://{tmp_path.name}/store")
    stage = store.url("run", "pairs")
    publish_file(store, stage, "pairs.jsonl", "{}\n{}\n", {"seed": 1})
    with store.fs.open(store.fs._strip_protocol(f"{stage}/pairs.jsonl"), "w") as f:
        f.write("{}\n")
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "another-machine"))
    store = ArtifactStore(store.root)
    assert store.manifest(stage, {"seed": 1}) is None


def test_nothing_in_the_store_is_unpickled(tmp_path):
    """Stages keep no Prefect results: a pickle planted where Prefect kept them, or anywhere in
    the store, is never loaded by a re-run."""
    import pickle

    from prefect import flow

    from flywheel.stage import stage_task

    marker = tmp_path / "pickle-was-loaded"

    class Planted:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    @stage_task("write")
    def write_stage(store_url: str, out_url: str) -> Manifest:
        store = ArtifactStore(store_url)
        if (done := store.manifest(out_url, {})) is not None:
            return done
        store.write_text(f"{out_url}/data.txt", "x")
        return store.publish(Manifest(stage="write", url=out_url), {})

    @flow
    def one_stage(store_url: str):
        return write_stage(store_url, f"{store_url}/run/stage", return_state=True)

    store = ArtifactStore(str(tmp_path / "store"))
    assert one_stage(store.root).name == "Completed"
    written = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert sorted(p.name for p in written) == ["_MANIFEST.json", "data.txt"]
    for folder in [tmp_path / "store" / ".prefect-results", tmp_path / "store" / "run" / "stage"]:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result").write_bytes(pickle.dumps(Planted()))
    assert one_stage(store.root).name == "Cached"
    assert not marker.exists()


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
    # this run's artifact: the key is the stage's, so another run's may be on the same server
    assert any(model in a.data and "disk is full" in a.data for a in found)

    assert one_stage(False, return_state=True).is_completed()
    assert not store.exists(store.url("run/half/_FAILED.json"))
