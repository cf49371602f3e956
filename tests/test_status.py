"""`flywheel status` (ops/status.py): which stages of a run are cached, which would re-run and
why, which never ran; read-only, on a local store and on S3.

A toy recipe of three stages runs for real (stage bodies are plain file writes), then status
plans it again under changed settings, code and upstream content."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import flywheel.stage
from flywheel.code_version import StageCode, module_digest
from flywheel.records import FailedStage, Manifest
from flywheel.stage import StageResult, StageRun, stage
from flywheel.storage import ArtifactStore
from ops.driver import Recipe, RoundResult, all_rounds
from ops.status import ReadOnlyStore, folder_status, plan, render


class MakeInputs(BaseModel):
    text: str


class CopyInputs(BaseModel):
    source_url: str
    repeat: int


@stage("make")
def make_stage(inputs: MakeInputs, run: StageRun) -> StageResult:
    return StageResult(files={"out": run.store.write_text(run.file("out.txt"), inputs.text)})


@stage("copy")
def copy_stage(inputs: CopyInputs, run: StageRun) -> StageResult:
    text = run.store.read_text(inputs.source_url) * inputs.repeat
    return StageResult(files={"out": run.store.write_text(run.file("out.txt"), text)})


class ToyConfig(BaseModel):
    run_name: str = "toy"
    storage_url: str
    rounds: int = 1
    text: str = "a"
    repeat: int = 2


class Toy(Recipe):
    """make → copy (round 0); copy (each round); each new "policy" evaluated by a copy."""

    name, title, config_class = "toy", "Toy", ToyConfig

    def __init__(self, cfg, store, tracking):
        self.cfg, self.store, self.tracking = cfg, store, tracking
        self.run_url = store.url(cfg.run_name)

    def start(self) -> RoundResult:
        made = make_stage.fn(MakeInputs(text=self.cfg.text), self.out("make"))
        copied = copy_stage.fn(CopyInputs(source_url=made.files["out"], repeat=1), self.out("sft"))
        return RoundResult(policy=copied.files["out"])

    def round(self, state) -> RoundResult:
        inputs = CopyInputs(source_url=state.policy, repeat=self.cfg.repeat)
        return RoundResult(
            policy=copy_stage.fn(inputs, self.out(f"round-{state.round}")).files["out"]
        )

    def evaluate(self, label, model_url, prefix=None):
        inputs = CopyInputs(source_url=model_url, repeat=1)
        return label, copy_stage.fn(inputs, self.out(f"evaluate/{label}"))

    def report(self, evaluations, notes) -> str:
        return ""


def snapshot(store: ArtifactStore) -> dict[str, str]:
    return {url: store.fs.cat_file(store._path(url)) for url in store.list_files(store.root)}


def states(statuses) -> dict[str, str]:
    return {s.url.rsplit("/toy/", 1)[-1]: s.state for s in statuses}


def reasons(statuses, folder: str) -> list[str]:
    return next(s.reasons for s in statuses if s.url.endswith("/toy/" + folder))


@pytest.fixture
def finished(tmp_path):
    """A toy run that finished: its config and its store."""
    cfg = ToyConfig(storage_url=str(tmp_path / "runs"))
    store = ArtifactStore(cfg.storage_url)
    all_rounds(cfg, store, None, Toy)
    return cfg, store


ALL = ["make", "sft", "evaluate/sft", "round-1", "evaluate/toy-round-1"]


def test_a_finished_run_is_cached_and_status_writes_nothing(finished):
    cfg, store = finished
    before = snapshot(store)
    statuses = plan(Toy, cfg, ReadOnlyStore(cfg.storage_url))
    assert states(statuses) == dict.fromkeys(ALL, "cached")
    assert snapshot(store) == before
    assert render(statuses, store.url("toy")).endswith("5 cached")


def test_a_changed_setting_is_named_and_everything_downstream_re_runs(finished):
    cfg, store = finished
    statuses = plan(Toy, cfg.model_copy(update={"text": "b"}), ReadOnlyStore(cfg.storage_url))
    assert states(statuses) == dict.fromkeys(ALL, "would re-run")
    assert reasons(statuses, "make") == ['setting text: "a" → "b"']
    [why] = reasons(statuses, "sft")
    assert (
        why == f"upstream {store.root}/toy/make/out.txt: the stage at {store.root}/toy/make "
        "re-runs first"
    )
    # Shown relative to the run's folder.
    assert "- upstream make/out.txt: the stage at make re-runs first\n" in render(
        statuses, store.url("toy")
    )


def test_a_setting_of_later_rounds_keeps_round_0_cached(finished):
    cfg, store = finished
    statuses = plan(Toy, cfg.model_copy(update={"repeat": 3}), ReadOnlyStore(cfg.storage_url))
    assert states(statuses) == {
        "make": "cached", "sft": "cached", "evaluate/sft": "cached",
        "round-1": "would re-run", "evaluate/toy-round-1": "would re-run",
    }  # fmt: skip
    assert reasons(statuses, "round-1") == ["setting repeat: 2 → 3"]


def test_a_round_never_run_stops_the_plan(finished):
    cfg, store = finished
    store.write_text(
        store.url("toy", "round-2", "_FAILED.json"),
        FailedStage(stage="copy", task_run="t", failed_at="2026-01-01T00:00:00",
                    message="ValueError: no pair fits\nmore").model_dump_json(),
    )  # fmt: skip
    statuses = plan(Toy, cfg.model_copy(update={"rounds": 3}), ReadOnlyStore(cfg.storage_url))
    assert states(statuses) == {**dict.fromkeys(ALL, "cached"), "round-2": "never run"}
    assert reasons(statuses, "round-2") == [
        "last attempt failed at 2026-01-01T00:00:00: ValueError: no pair fits",
        "a run starts here; the stages after it read its output (not planned further)",
    ]
    # Fewer rounds: the stages a run would not reach are listed too.
    statuses = plan(Toy, cfg.model_copy(update={"rounds": 0}), ReadOnlyStore(cfg.storage_url))
    assert states(statuses)["round-1"] == "not planned"


def test_a_changed_module_is_named(tmp_path, monkeypatch):
    cfg = ToyConfig(storage_url=str(tmp_path / "runs"))
    old = StageCode({"tasks.toy": "d1", "flywheel.stage": "s1"}, {"trl": "1.0"})
    monkeypatch.setattr(flywheel.stage, "stage_code", lambda roots: old)
    all_rounds(cfg, ArtifactStore(cfg.storage_url), None, Toy)
    new = StageCode({"tasks.toy": "d2", "flywheel.stage": "s1"}, {"trl": "1.1"})
    monkeypatch.setattr(flywheel.stage, "stage_code", lambda roots: new)
    statuses = plan(Toy, cfg, ReadOnlyStore(cfg.storage_url))
    assert reasons(statuses, "make") == ["module tasks.toy changed", "library trl: 1.0 → 1.1"]
    assert states(statuses) == dict.fromkeys(ALL, "would re-run")


def publish_stage(store, folder: str, text: str, inputs: dict, code: StageCode) -> str:
    url = store.url("toy", folder)
    store.write_text(f"{url}/out.txt", text)
    store.publish(Manifest(stage=folder, url=url, files={"out": f"{url}/out.txt"}), inputs, code)
    return f"{url}/out.txt"


def folder_checks(store: ArtifactStore) -> None:
    """A run folder alone: code now (this project's files) and upstream content against each
    manifest; a failed stage is named."""
    now = StageCode({"tasks.sft": module_digest("tasks.sft")}, {})
    stale = StageCode({"tasks.sft": "0123456789abcdef"}, {})
    made = publish_stage(store, "make", "a", {"text": "a"}, now)
    publish_stage(store, "sft", "aa", {"source_url": made}, now)
    publish_stage(store, "old", "x", {"n": 1}, stale)
    store.write_text(
        store.url("toy", "failed", "_FAILED.json"),
        FailedStage(stage="dpo", task_run="t", failed_at="2026-01-01T00:00:00",
                    message="RuntimeError: boom").model_dump_json(),
    )  # fmt: skip
    before = snapshot(store)
    reader = ReadOnlyStore(store.root)
    statuses = folder_status(reader, store.url("toy"))
    assert states(statuses) == {
        "failed": "never run",
        "make": "cached",
        "old": "would re-run",
        "sft": "cached",
    }
    assert reasons(statuses, "old") == ["module tasks.sft changed"]
    # The upstream file changed under its manifest (a re-run stage would publish a new one).
    publish_stage(store, "make", "b", {"text": "b"}, now)
    statuses = folder_status(reader, store.url("toy"))
    [why] = reasons(statuses, "sft")
    assert why.startswith(f"upstream {made} changed (content ")
    assert states(statuses)["make"] == "cached"
    assert snapshot(store) != before  # (the test's own publish above)
    after = snapshot(store)
    folder_status(reader, store.url("toy"))
    assert snapshot(store) == after


def test_a_run_folder_alone_compares_code_and_upstream(tmp_path):
    folder_checks(ArtifactStore(str(tmp_path / "runs")))


def test_a_run_folder_on_s3(s3_store):  # noqa: F811
    folder_checks(s3_store)


def test_status_never_writes_or_removes(tmp_path, capsys):
    store = ArtifactStore(str(tmp_path))
    store.write_text(store.url("toy", "sft", "_MANIFEST.json"), "{not json")
    reader = ReadOnlyStore(store.root)
    assert reader.read_manifest(store.url("toy", "sft")) is None
    assert store.exists(store.url("toy", "sft", "_MANIFEST.json"))  # a run would remove it
    with pytest.raises(PermissionError):
        reader.write_text(store.url("x"), "x")


def test_the_command(finished, capsys):
    from ops.cli import main

    cfg, store = finished
    assert main(["status", f"{cfg.storage_url}/toy"]) == 0
    out = capsys.readouterr().out
    assert "cached        copy                 sft\n" in out and out.endswith("5 cached\n")
    assert main(["--help"]) == 0
    assert "status" in capsys.readouterr().out
    assert main(["status", "eto", "--config", "configs/eto_textcraft.yaml", "dpo.betta=1"]) == 2
    assert "betta" in capsys.readouterr().err
