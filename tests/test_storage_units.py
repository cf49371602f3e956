"""The artifact store piece by piece, with answers written out by hand: URLs, digests, listings,
stage keys, the messages a damaged or unreadable stage gives, and local copies of remote files
(a `memory://` store stands in for S3)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel

import flywheel.storage as storage
from flywheel.code_version import StageCode
from flywheel.records import FileDigest, Manifest, Message
from flywheel.storage import (
    ArtifactStore,
    CorruptArtifact,
    cache_root,
    digest_of_entries,
    hash_local_file,
    link_or_copy,
    normalise_url,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def remote(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    return ArtifactStore(f"memory://{tmp_path.name}/store")


def test_urls_are_normalised_and_joined(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalise_url("runs/a") == f"file://{tmp_path}/runs/a"
    assert normalise_url("s3://bucket/runs/") == "s3://bucket/runs"
    assert normalise_url("s3://bucket/runs") == "s3://bucket/runs"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert normalise_url("~/runs") == f"file://{tmp_path}/home/runs"
    store = ArtifactStore("s3://bucket/runs/")
    assert store.root == "s3://bucket/runs" and not store.is_local
    assert store.url("/run/", "sft/", "model") == "s3://bucket/runs/run/sft/model"
    assert store.url() == "s3://bucket/runs"
    assert store.top_folder("s3://bucket/runs/run-a/sft/model") == "run-a"
    assert store.top_folder("s3://bucket/runs/run-a") == "run-a"
    assert store.top_folder("s3://bucket/runs") == ""
    assert store.top_folder("s3://bucket/runsx/run-a") == ""
    assert store.top_folder("s3://other/run-a") == ""
    assert store.is_artifact_url("s3://bucket/runs/a") and store.is_artifact_url("file:///m")
    assert not store.is_artifact_url("s3://bucket/runsx/a")
    assert not store.is_artifact_url("epochs=3")
    assert ArtifactStore(str(tmp_path)).is_local


def test_the_cache_is_flywheel_cache_or_the_home_default(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert ArtifactStore(str(tmp_path)).cache_dir == tmp_path / "c"
    assert ArtifactStore(str(tmp_path), cache_dir=str(tmp_path / "d")).cache_dir == tmp_path / "d"
    monkeypatch.delenv("FLYWHEEL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "flywheel"


def test_digests_of_entries_and_of_local_files(tmp_path):
    # sorted (name, sha256) pairs as JSON, its sha256 cut to 16 hex digits
    assert digest_of_entries({"b": "2", "a": "1"}) == sha(b'[["a", "1"], ["b", "2"]]')[:16]
    assert digest_of_entries({}) == sha(b"[]")[:16]
    path = tmp_path / "big.bin"
    data = bytes(range(256)) * 10_000  # 2.4 MiB: more than one read
    path.write_bytes(data)
    assert hash_local_file(str(path)) == FileDigest(size=len(data), sha256=sha(data))
    path.write_bytes(b"other")
    assert hash_local_file(str(path)) == FileDigest(size=5, sha256=sha(b"other"))


def test_writes_reads_and_listings(tmp_path):
    store = ArtifactStore(str(tmp_path))
    assert store.write_bytes(store.url("a", "b", "c.bin"), b"\x00\x01") == store.url("a/b/c.bin")
    assert (tmp_path / "a" / "b" / "c.bin").read_bytes() == b"\x00\x01"
    store.write_bytes(store.url("a", "b", "e.bin"), b"\x02")  # into a folder that exists
    store.write_text(store.url("a", "b", "f.txt"), "f")
    store.remove(store.url("a", "b", "e.bin"))
    store.remove(store.url("a", "b", "f.txt"))
    store.write_json(store.url("a", "d.json"), {"x": [1]})
    assert (tmp_path / "a" / "d.json").read_text() == '{\n  "x": [\n    1\n  ]\n}'
    assert store.read_json(store.url("a", "d.json")) == {"x": [1]}
    assert store.list_files(store.url("a")) == [store.url("a/b/c.bin"), store.url("a/d.json")]
    assert store.list_files(store.url("a") + "/") == store.list_files(store.url("a"))
    store.write_text(store.url("LAX"), "a name ending in a letter is kept whole")
    assert store.list_files(store.url("LAX")) == [store.url("LAX")]
    store.remove(store.url("LAX"))
    assert store.list_files(store.url("a/d.json")) == [store.url("a/d.json")]
    assert store.list_files(store.url("nothing")) == []
    store.remove(store.url("a/d.json"))
    store.remove(store.url("a/d.json"))  # already gone: nothing to do
    assert not store.exists(store.url("a/d.json")) and store.exists(store.url("a/b/c.bin"))
    records = [Message(role="user", content="x"), Message(role="assistant", content="y")]
    url = store.write_records(store.url("r.jsonl"), records)
    assert (tmp_path / "r.jsonl").read_text() == "".join(
        m.model_dump_json() + "\n" for m in records
    )
    (tmp_path / "r.jsonl").write_text((tmp_path / "r.jsonl").read_text() + "\n")
    assert store.read_records(url, Message) == records  # a blank line is no record
    store.write_text(url, '{"role": "user", "content": "a"}\n{"role": "robot"}\n')
    with pytest.raises(CorruptArtifact) as error:
        store.read_records(url, Message)
    assert str(error.value) == (
        f"{url}, line 2: not a Message record (2 errors; first: Input should be 'system', "
        "'user' or 'assistant')"
    )


def test_a_writable_store_leaves_nothing_behind_and_an_unwritable_one_is_named(tmp_path):
    store = ArtifactStore(str(tmp_path / "runs"))
    store.check_writable()
    assert os.listdir(tmp_path / "runs") == []
    (tmp_path / "file").write_text("x")
    blocked = ArtifactStore(str(tmp_path / "file" / "runs"))
    with pytest.raises(OSError) as error:
        blocked.check_writable()
    assert str(error.value).startswith(
        f"storage_url 'file://{tmp_path}/file/runs' is not writable: "
    )
    assert isinstance(error.value.__cause__, OSError)


class Dated(BaseModel):
    folder: Path
    at: datetime


def test_a_stage_key_resolves_settings_and_digests_every_artifact_it_names(tmp_path):
    code = StageCode({"tasks.sft": "d1"}, {"trl": "1.0"})
    v1 = code.version
    assert v1 == sha(json.dumps([[["tasks.sft", "d1"]], [["trl", "1.0"]]]).encode())[:16]
    store = ArtifactStore(str(tmp_path))
    model = store.url("run", "sft", "model")
    store.write_text(f"{model}/w.bin", "weights")
    digest = store.content_digest(model)
    assert digest == digest_of_entries({"/w.bin": sha(b"weights")})
    inputs = {
        "model": model, "n": 3, "settings": Message(role="user", content="c"),
        "tasks": ("a", model), 7: "seven",
    }  # fmt: skip
    key, upstream = store.stage_key(inputs, code)
    assert upstream == {model: digest}
    resolved = {
        "model": model, "n": 3,
        "settings": {"role": "user", "content": "c", "loss": False, "token_ids": None,
                     "end_generated": True, "logprobs": None, "reward": None},
        "tasks": ["a", model], "7": "seven",
    }  # fmt: skip
    text = json.dumps([resolved, upstream, v1], sort_keys=True)
    assert key == sha(text.encode())[:16]
    # Outside a stage (no code), the key holds the inputs alone.
    no_code = json.dumps([resolved, upstream, ""], sort_keys=True)
    assert store.stage_key(inputs) == (sha(no_code.encode())[:16], upstream)
    # Settings holding a path or a date enter as their JSON, as `model_dump(mode="json")` has them.
    dated = Dated(folder=Path("/data/x"), at=datetime(2026, 11, 25, tzinfo=UTC))
    as_json = {"s": {"folder": "/data/x", "at": "2026-11-25T00:00:00Z"}}
    expected = sha(json.dumps([as_json, {}, v1], sort_keys=True).encode())[:16]
    assert store.stage_key({"s": dated}, code) == (expected, {})
    assert store.stage_key({"url": "s3://elsewhere/x"}, code) == (
        sha(json.dumps([{"url": "s3://elsewhere/x"}, {}, v1], sort_keys=True).encode())[:16],
        {},
    )


def test_content_digests_come_from_the_covering_manifest_or_the_files(tmp_path):
    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "sft")
    store.write_text(f"{stage}/model/a.txt", "A")
    store.write_text(f"{stage}/model/sub/b.txt", "B")
    store.write_text(f"{stage}/log.txt", "L")
    manifest = store.publish(Manifest(stage="sft", url=stage))
    assert sorted(manifest.checksums) == ["log.txt", "model/a.txt", "model/sub/b.txt"]
    want = digest_of_entries({"/a.txt": sha(b"A"), "/sub/b.txt": sha(b"B")})
    assert store.content_digest(f"{stage}/model") == want
    assert store.content_digest(f"{stage}/model/a.txt") == digest_of_entries({"": sha(b"A")})
    # The manifest, not the file, is the record: a file changed since is not re-read here.
    (tmp_path / "run" / "sft" / "model" / "a.txt").write_text("changed")
    assert store.content_digest(f"{stage}/model") == want
    assert store.covering_manifest(f"{stage}/model/sub/b.txt").url == stage
    assert store.covering_manifest(stage).url == stage
    assert store.covering_manifest(store.url("run")) is None
    assert store.covering_manifest("file:///elsewhere/x") is None
    # Unmanaged: read from the files themselves; absent: said so.
    store.write_text(store.url("loose", "x.txt"), "X")
    assert store.content_digest(store.url("loose")) == digest_of_entries({"/x.txt": sha(b"X")})
    assert store.content_digest(store.url("missing")) == "absent"
    assert store.content_digest(f"{stage}/model/none") == "absent"


def test_publishing_records_every_file_the_stage_wrote_or_named(tmp_path):
    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "train")
    outside = store.url("models", "m")
    store.write_text(f"{stage}/data.txt", "D")
    store.write_text(f"{stage}/_FAILED.json", "{}")
    store.write_text(f"{outside}/w.bin", "W")
    manifest = store.publish(Manifest(stage="train", url=stage, files={"model": outside,
                                                                      "data": f"{stage}/data.txt"}))  # fmt: skip
    assert manifest.checksums == {
        "data.txt": FileDigest(size=1, sha256=sha(b"D")),
        f"{outside}/w.bin": FileDigest(size=1, sha256=sha(b"W")),
    }
    assert manifest.code_version == manifest.inputs_digest == "" and manifest.code == {}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", manifest.published_at)
    assert not store.exists(f"{stage}/_FAILED.json")
    stored = json.loads((tmp_path / "run" / "train" / "_MANIFEST.json").read_text())
    assert stored == json.loads(manifest.model_dump_json())
    assert (tmp_path / "run" / "train" / "_MANIFEST.json").read_text().startswith('{\n  "stage"')
    assert store.manifest(stage) == manifest and not store.manifest(stage).served_from_store
    code = StageCode({"tasks.train": "d1", "configs/a.yaml": "d2"}, {"trl": "1.0"})
    inputs = {"n": 1, "data": f"{stage}/data.txt"}
    keyed = store.publish(Manifest(stage="train", url=stage), inputs, code)
    assert (keyed.inputs_digest, keyed.upstream) == store.stage_key(inputs, code)
    # What the key was computed from, so `flywheel status` can name what changed.
    assert keyed.key_inputs == inputs and keyed.code_version == code.version
    assert (keyed.code, keyed.libraries) == (code.modules, code.libraries)
    assert store.manifest(stage, inputs, code).served_from_store


def test_what_no_longer_matches_a_manifest_is_named(tmp_path, capsys):
    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "s")
    for name, text in [("a.txt", "aaaa"), ("b.txt", "bbbb"), ("c.txt", "cccc"),
                       ("sub/d.txt", "dddd")]:  # fmt: skip
        store.write_text(f"{stage}/{name}", text)
    manifest = store.publish(Manifest(stage="s", url=stage), {"k": 1})
    assert store.check_files(manifest) == []
    folder = tmp_path / "run" / "s"
    (folder / "a.txt").unlink()
    (folder / "b.txt").write_text("bb")
    (folder / "c.txt").write_text("cccC")
    (folder / "sub" / "d.txt").write_text("ddd")
    changed = f"sha256 {sha(b'cccC')[:12]}, manifest {sha(b'cccc')[:12]}"
    assert store.check_files(manifest) == [
        f"{stage}/a.txt is missing",
        f"{stage}/b.txt has 2 bytes, its manifest says 4",
        f"{stage}/c.txt has changed ({changed})",
        f"{stage}/sub/d.txt has 3 bytes, its manifest says 4",
    ]
    assert store.check_files(manifest, under=f"{stage}/sub") == [
        f"{stage}/sub/d.txt has 3 bytes, its manifest says 4"
    ]
    assert store.check_files(manifest, under=f"{stage}/c.txt") == [
        f"{stage}/c.txt has changed ({changed})"
    ]
    assert store.check_files(manifest, under=f"{stage}/su") == []
    assert store.manifest(stage, {"k": 1}) is None
    assert capsys.readouterr().out == (
        f"stage s ({stage}) is redone: {stage}/a.txt is missing; {stage}/b.txt has 2 bytes, its "
        f"manifest says 4; {stage}/c.txt has changed ({changed}); {stage}/sub/d.txt has 3 bytes, "
        "its manifest says 4\n"
    )
    assert not store.exists(f"{stage}/_MANIFEST.json")


def test_a_damaged_input_is_refused_naming_the_stage_and_its_manifest_goes(tmp_path):
    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "s")
    store.write_text(f"{stage}/x.txt", "xx")
    store.write_text(f"{stage}/y.txt", "yy")
    store.publish(Manifest(stage="s", url=stage))
    assert store.verified(f"{stage}/x.txt").url == stage
    assert store.verified(store.url("unmanaged.txt")) is None
    (tmp_path / "run" / "s" / "y.txt").write_text("y")
    assert store.read_text(f"{stage}/x.txt") == "xx"  # only what is read is checked
    with pytest.raises(CorruptArtifact) as error:
        store.read_text(f"{stage}/y.txt")
    assert str(error.value) == (
        f"{stage}/y.txt has 1 bytes, its manifest says 2: written by stage 's' ({stage}), whose "
        "manifest is now removed; run again to redo that stage"
    )
    assert store.read_manifest(stage) is None


def test_an_unreadable_manifest_counts_as_absent_and_is_removed(tmp_path, capsys):
    store = ArtifactStore(str(tmp_path))
    stage = store.url("run", "s")
    store.write_text(f"{stage}/_MANIFEST.json", '{"stage": "s"')
    assert store.read_manifest(stage) is None
    out = capsys.readouterr().out
    assert out.startswith(f"{stage}/_MANIFEST.json is unreadable (1 validation error for Manifest)")
    assert out.endswith("; the stage is redone\n")
    assert not store.exists(f"{stage}/_MANIFEST.json")
    store.write_text(f"{stage}/_MANIFEST.json", '{"stage": "s", "url": "u"}')
    assert store.manifest(stage, None).url == "u"  # without inputs: as found, unchecked


def test_local_folders_of_a_local_store_are_the_folders_themselves(tmp_path):
    store = ArtifactStore(str(tmp_path))
    assert store.write_dir(store.url("run", "m")) == tmp_path / "run" / "m"
    store.write_text(store.url("run", "m", "a.txt"), "A")
    assert store.local_dir(store.url("run", "m")) == tmp_path / "run" / "m"
    assert store.local_file(store.url("run", "m", "a.txt")) == tmp_path / "run" / "m" / "a.txt"
    with pytest.raises(AssertionError, match="write_dir is for file:// stores"):
        ArtifactStore("memory://x/y").write_dir("memory://x/y/m")


def test_remote_folders_are_uploaded_and_copied_here_keyed_on_their_content(
    tmp_path, remote, monkeypatch
):
    source = tmp_path / "model"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "sub" / "w.bin").write_bytes(b"\x01\x02\x03")
    stage = remote.url("run", "sft")
    assert remote.upload_dir(source, f"{stage}/model") == f"{stage}/model"
    assert remote.list_files(f"{stage}/model") == [f"{stage}/model/config.json",
                                                   f"{stage}/model/sub/w.bin"]  # fmt: skip
    remote.publish(Manifest(stage="sft", url=stage))
    local = remote.local_dir(f"{stage}/model")
    tree = digest_of_entries({"config.json": sha(b"{}"), "sub/w.bin": sha(b"\x01\x02\x03")})
    assert local == tmp_path / "cache" / "downloads" / f"tree-{tree}"
    assert (local / "config.json").read_text() == "{}"
    assert (local / "sub" / "w.bin").read_bytes() == b"\x01\x02\x03"
    assert (local / ".complete").exists()
    blobs = tmp_path / "cache" / "downloads" / "blobs"
    assert (blobs / sha(b"{}") / "config.json").read_text() == "{}"
    assert sorted(p.name for p in blobs.iterdir()) == sorted([sha(b"{}"), sha(b"\x01\x02\x03")])
    # The copy is kept: asked again, nothing is downloaded.
    monkeypatch.setattr(remote.fs, "get_file", None)
    assert remote.local_dir(f"{stage}/model") == local
    assert remote.local_file(f"{stage}/model/config.json") == blobs / sha(b"{}") / "config.json"


def test_a_remote_folder_nested_two_deep_with_files_side_by_side_is_copied_whole(tmp_path, remote):
    source = tmp_path / "model"
    (source / "a" / "b").mkdir(parents=True)
    for name in ("a/b/c.txt", "a/b/d.txt"):
        (source / name).write_text(name)
    stage = remote.url("run", "sft")
    remote.upload_dir(source, f"{stage}/model")
    remote.publish(Manifest(stage="sft", url=stage))
    local = remote.local_dir(f"{stage}/model")
    assert sorted(str(p.relative_to(local)) for p in local.rglob("*.txt")) == [
        "a/b/c.txt", "a/b/d.txt"
    ]  # fmt: skip
    assert (local / "a" / "b" / "d.txt").read_text() == "a/b/d.txt"


def test_blank_lines_between_records_are_skipped_not_the_end(tmp_path):
    store = ArtifactStore(str(tmp_path))
    url = store.url("m.jsonl")
    first, second = Message(role="user", content="1"), Message(role="user", content="2")
    store.write_text(url, f"{first.model_dump_json()}\n\n{second.model_dump_json()}\n")
    assert store.read_records(url, Message) == [first, second]


def test_an_unmanaged_remote_file_is_downloaded_each_time_and_stored_under_its_digest(
    tmp_path, remote
):
    url = remote.write_text(remote.url("loose", "notes.txt"), "n1")
    blobs = tmp_path / "cache" / "downloads" / "blobs"
    assert remote.local_file(url) == blobs / sha(b"n1") / "notes.txt"
    remote.write_text(url, "n2")
    assert remote.local_file(url).read_text() == "n2"
    assert remote.read_text(url) == "n2"
    assert not [p for p in blobs.iterdir() if p.name.endswith(".part")]
    folder = remote.local_dir(remote.url("loose"))
    assert (folder / "notes.txt").read_text() == "n2"
    assert remote.hash_file(url) == FileDigest(size=2, sha256=sha(b"n2"))


def test_a_copy_here_is_trusted_only_for_the_size_the_manifest_expects(tmp_path, remote):
    url = remote.write_text(remote.url("run", "s", "f.txt"), "good")
    expected = FileDigest(size=4, sha256=sha(b"good"))
    blob = tmp_path / "cache" / "downloads" / "blobs" / expected.sha256 / "f.txt"
    blob.parent.mkdir(parents=True)
    blob.write_text("bad!")  # same size: trusted, as named by its digest
    assert remote._blob(url, expected) == (blob, expected)
    blob.write_text("bad")  # another size: downloaded again
    path, digest = remote._blob(url, expected)
    assert path == blob and path.read_text() == "good" and digest == expected
    assert remote._blob(url) == (blob, expected)


def test_link_or_copy_keeps_an_existing_target_and_copies_where_it_cannot_link(
    tmp_path, monkeypatch
):
    source, target = tmp_path / "s", tmp_path / "t"
    source.write_text("S")
    target.write_text("T")
    link_or_copy(source, target)
    assert target.read_text() == "T"
    target.unlink()
    link_or_copy(source, target)
    assert target.read_text() == "S" and os.path.samefile(source, target)

    def no_links(*args):
        raise OSError("cross-device link")

    monkeypatch.setattr(storage.os, "link", no_links)
    copy = tmp_path / "c"
    link_or_copy(source, copy)
    assert copy.read_text() == "S" and not os.path.samefile(source, copy)
    assert Path(copy).stat().st_nlink == 1


def test_a_folder_uploaded_to_a_local_store_keeps_its_tree(tmp_path):
    source = tmp_path / "model"
    (source / "a" / "b").mkdir(parents=True)
    (source / "top.txt").write_text("T")
    (source / "a" / "b" / "deep.txt").write_text("D")
    store = ArtifactStore(str(tmp_path / "store"))
    assert store.upload_dir(source, store.url("run", "m")) == store.url("run", "m")
    assert (tmp_path / "store" / "run" / "m" / "top.txt").read_text() == "T"
    assert (tmp_path / "store" / "run" / "m" / "a" / "b" / "deep.txt").read_text() == "D"
