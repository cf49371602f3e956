"""Every variant of a stage is kept: a result published for one key is parked under that key when
another key runs, and served again when its key comes back (a retried old flow run, a setting
switched back, a sweep under one run name). Only `flywheel gc` deletes parked results."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from flywheel.records import Manifest
from flywheel.stage import StageOutput, StageResult, StageRun, stage
from flywheel.storage import MANIFEST, ArtifactStore
from ops.gc import collect
from ops.gc import main as gc_main
from ops.status import ReadOnlyStore


class RepeatInputs(BaseModel):
    text_url: str
    repeat: int
    fail: bool = False


calls: list[int] = []


@stage("repeat")
def repeat_stage(inputs: RepeatInputs, run: StageRun) -> StageResult:
    calls.append(inputs.repeat)
    text = run.store.read_text(inputs.text_url) * inputs.repeat
    url = run.store.write_text(run.file("model/out.txt"), text)
    if inputs.fail:
        raise RuntimeError("no pair fits in max_length=64 → raise dpo.max_length")
    return StageResult(files={"out": url}, counts={"chars": len(text)})


@pytest.fixture
def store(tmp_path):
    calls.clear()
    store = ArtifactStore(str(tmp_path / "store"))
    store.write_text(store.url("data/text.txt"), "ab")
    store.publish(Manifest(stage="data", url=store.url("data")))
    return store


def run(store: ArtifactStore, repeat: int, fail: bool = False) -> Manifest:
    inputs = RepeatInputs(text_url=store.url("data/text.txt"), repeat=repeat, fail=fail)
    return repeat_stage.fn(inputs, StageOutput(store_url=store.root, url=store.url("run/dpo")))


def test_a_sweep_of_three_values_and_back_serves_the_first_from_the_store(store):
    for repeat in (1, 2, 3):
        assert run(store, repeat).counts == {"chars": 2 * repeat}
    again = run(store, 1)
    assert again.served_from_store and again.counts == {"chars": 2}
    assert calls == [1, 2, 3]  # the first value's body did not run again
    assert store.read_text(store.url("run/dpo/model/out.txt")) == "ab"
    assert len(store.variants(store.url("run/dpo"))) == 2  # 2 and 3, parked


def test_a_retried_failing_run_leaves_the_newer_result_whole(store):
    """The Retry case: a run fails for one key, another key publishes, then the first run is
    retried (and fails again); the published result is still there and is served to its key."""
    with pytest.raises(RuntimeError):
        run(store, 1, fail=True)
    good = run(store, 2)
    with pytest.raises(RuntimeError):
        run(store, 1, fail=True)  # the retry of the old flow run: its own key, not the newer one
    assert store.read_manifest(store.url("run/dpo")) is None  # the retry's failure is in place
    served = run(store, 2)
    assert served.served_from_store and served.checksums == good.checksums
    assert calls == [1, 2, 1]
    assert not store.exists(store.url("run/dpo/_FAILED.json"))  # served: the failure is history


def test_a_damaged_parked_result_is_redone_not_served(store):
    run(store, 1)
    run(store, 2)
    [parked] = store.variants(store.url("run/dpo")).values()
    key = parked.inputs_digest
    store.write_text(f"{store.variant_url(store.url('run/dpo'), key)}/model/out.txt", "XX")
    assert not run(store, 1).served_from_store
    assert calls == [1, 2, 1]


def test_a_park_cut_short_is_finished_by_the_next_run(store, monkeypatch):
    """Files move first and the manifest last: a park killed after its first move leaves the
    manifest in place, and the next run parks what is left into the same variant folder."""
    first = run(store, 1)
    moves = []
    real_move = ArtifactStore.move

    def killed_on_the_second_move(self, source, target):
        moves.append(source)
        if len(moves) == 2:
            raise KeyboardInterrupt("killed")
        real_move(self, source, target)

    monkeypatch.setattr(ArtifactStore, "move", killed_on_the_second_move)
    with pytest.raises(KeyboardInterrupt):
        run(store, 2)
    monkeypatch.setattr(ArtifactStore, "move", real_move)
    run(store, 2)
    assert set(store.variants(first.url)) == {first.inputs_digest}
    assert run(store, 1).served_from_store and calls == [1, 2]


def test_stages_nested_in_a_folder_stay_where_they_are(store):
    inner = store.url("run/dpo/inner")
    store.write_text(f"{inner}/x.txt", "its own stage")
    store.publish(Manifest(stage="inner", url=inner))
    run(store, 1)
    run(store, 2)
    assert store.read_text(f"{inner}/x.txt") == "its own stage"
    assert store.read_manifest(inner) is not None


def test_status_reads_a_parked_result_as_served_and_moves_nothing(store):
    from ops.status import Planner

    run(store, 1)
    run(store, 2)
    files_before = sorted(store.list_files(store.root))
    reader = ReadOnlyStore(store.root)
    planner = Planner(reader)
    inputs = RepeatInputs(text_url=store.url("data/text.txt"), repeat=1)
    out = StageOutput(store_url=store.root, url=store.url("run/dpo"))
    from flywheel.stage import cache_inputs, stage_code

    planner("repeat", cache_inputs("repeat", inputs), stage_code(repeat_stage.code_roots), out)
    status = planner.statuses[out.url]
    assert status.state == "cached" and "kept result" in status.reasons[0]
    assert sorted(store.list_files(store.root)) == files_before


def test_gc_lists_then_deletes_only_parked_results(store, capsys):
    run(store, 1)
    run(store, 2)
    current = store.read_manifest(store.url("run/dpo"))
    found = collect(store, store.url("run"))
    assert [v.key for v in found] == [k for k in store.variants(store.url("run/dpo"))]
    assert gc_main([store.url("run"), "--store", store.root]) == 0  # a dry run by default
    assert "would delete" in capsys.readouterr().out and store.variants(store.url("run/dpo"))
    assert gc_main([store.url("run"), "--store", store.root, "--yes"]) == 0
    assert store.variants(store.url("run/dpo")) == {}
    kept = store.read_manifest(store.url("run/dpo"))
    assert kept.inputs_digest == current.inputs_digest and not store.check_files(kept)
    assert store.exists(store.url("data", MANIFEST))
