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
