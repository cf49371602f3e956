"""Checkpoints in the store without a trainer: the pickle-free state format, publishing (record
last, older ones removed), finding the newest one for the stage's key (others removed, never
resumed), checked downloads, and the Trainer's files converted and restored."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from flywheel.settings import DPOSettings, RLSettings, SFTSettings
from flywheel.stage import StageOutput, StageResult, cache_inputs, planning, stage
from flywheel.storage import ArtifactStore
from ops.status import Planner
from tasks.dpo import DPOInputs
from tasks.rl import RLInputs
from tasks.sft import SFTInputs
from training.checkpoint import (
    CheckpointClock,
    CheckpointPlan,
    DamagedCheckpoint,
    UnstorableState,
    checkpoint_plan,
    decode_state,
    download_checkpoint,
    encode_state,
    latest_checkpoint,
    mirroring_callback,
    publish_checkpoint,
    pull_checkpoint,
    pull_trainer_checkpoint,
    remove_checkpoints,
    restore_trainer_files,
    trainer_files,
)
from training.job import TrainingJob, checkpointing


def optimizer_like_state() -> dict:
    """What AdamW's state_dict, a scheduler's and the Trainer's RNG file hold."""
    random.seed(3)
    np.random.seed(3)
    return {
        "state": {0: {"step": torch.tensor(4.0), "exp_avg": torch.arange(6.0).reshape(2, 3)}},
        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "params": [0], "foreach": None}],
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
        "last_lr": [float("nan"), 0.1 + 0.2],
        "flags": [True, "cosine", np.float64(0.5)],
    }


def assert_same(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def test_state_round_trips_through_json_and_tensors_with_its_types():
    state = optimizer_like_state()
    tensors: dict = {}
    tree = json.loads(json.dumps(encode_state(state, tensors)))  # what the store holds
    assert_same(decode_state(tree, tensors), state)
    # int keys stay ints, tuples tuples: torch's optimizer and random.setstate need them
    restored = decode_state(tree, tensors)
    assert 0 in restored["state"] and isinstance(restored["param_groups"][0]["betas"], tuple)
    random.setstate(restored["python"])
    np.random.set_state(restored["numpy"])
    assert random.random() == random.Random(3).random()


def test_a_value_that_would_need_pickling_is_refused():
    with pytest.raises(UnstorableState, match="set"):
        encode_state({"x": {1, 2}}, {})


def plan(tmp_path, key: str) -> CheckpointPlan:
    store = ArtifactStore(str(tmp_path / "store"))
    return CheckpointPlan(
        store_url=store.root, url=store.url("sft/checkpoint"), key=key, every_steps=1
    )


def files(tmp_path, content: str) -> dict:
    path = tmp_path / f"{content}.txt"
    path.write_text(content)
    return {"weights.txt": path}


def test_the_newest_checkpoint_for_the_key_is_found_and_older_ones_are_gone(tmp_path):
    mine = plan(tmp_path, "key-a")
    publish_checkpoint(mine, files(tmp_path, "two"), step=2)
    url = publish_checkpoint(mine, files(tmp_path, "four"), step=4)
    found_url, record = latest_checkpoint(mine)
    assert (found_url, record["step"], record["key"]) == (url, 4, "key-a")
    store = ArtifactStore(mine.store_url)
    assert [u.rsplit("/", 2)[-2] for u in store.list_files(mine.url)] == ["step-00000004"] * 2
    local = download_checkpoint(mine, found_url, record, tmp_path / "pulled")
    assert (local / "weights.txt").read_text() == "four"


def test_a_checkpoint_written_for_other_inputs_is_removed_not_resumed(tmp_path, capsys):
    publish_checkpoint(plan(tmp_path, "other-inputs"), files(tmp_path, "theirs"), step=7)
    mine = plan(tmp_path, "key-a")
    assert latest_checkpoint(mine) is None
    assert "written for other inputs" in capsys.readouterr().out
    assert ArtifactStore(mine.store_url).list_files(mine.url) == []
    assert pull_trainer_checkpoint(mine, tmp_path / "work") is None  # the trainer starts at 0


def test_a_checkpoint_without_its_record_is_incomplete_and_removed(tmp_path):
    mine = plan(tmp_path, "key-a")
    publish_checkpoint(mine, files(tmp_path, "two"), step=2)
    url = publish_checkpoint(mine, files(tmp_path, "four"), step=4)
    # a later step cut short: its files, no record
    store = ArtifactStore(mine.store_url)
    store.write_text(f"{mine.url}/step-00000006/weights.txt", "six, half written")
    found_url, record = latest_checkpoint(mine)
    assert found_url == url and record["step"] == 4
    assert not store.exists(f"{mine.url}/step-00000006")


def test_a_changed_checkpoint_file_is_refused_on_download(tmp_path):
    mine = plan(tmp_path, "key-a")
    url = publish_checkpoint(mine, files(tmp_path, "four"), step=4)
    ArtifactStore(mine.store_url).write_text(f"{url}/weights.txt", "fore")
    found_url, record = latest_checkpoint(mine)
    with pytest.raises(ValueError, match="does not match its checkpoint record"):
        download_checkpoint(mine, found_url, record, tmp_path / "pulled")
    assert not (tmp_path / "pulled").exists()


def flip_a_byte(store: ArtifactStore, url: str) -> None:
    data = bytearray(store.fs.cat_file(store._path(url)))
    data[len(data) // 2] ^= 0x01
    store.write_bytes(url, bytes(data))


def set_aside_folders(store: ArtifactStore, plan: CheckpointPlan) -> list[str]:
    return sorted({u.rsplit("/", 2)[-2] for u in store.list_files(plan.url) if ".damaged-" in u})


def test_a_damaged_checkpoint_is_set_aside_and_the_one_before_it_resumed(tmp_path, capsys):
    mine = plan(tmp_path, "key-a")
    store = ArtifactStore(mine.store_url)
    older = publish_checkpoint(mine, files(tmp_path, "two"), step=2)
    kept = f"{tmp_path}/kept-step-2"  # publishing step 4 removes step 2: keep a copy
    store.fs.copy(store._path(older), kept, recursive=True)
    newest = publish_checkpoint(mine, files(tmp_path, "four"), step=4)
    store.fs.copy(kept, store._path(older), recursive=True)
    flip_a_byte(store, f"{newest}/weights.txt")

    url, record, local = pull_checkpoint(mine, tmp_path / "pulled")
    assert (url, record["step"], (local / "weights.txt").read_text()) == (older, 2, "two")
    [moved] = set_aside_folders(store, mine)
    assert moved.startswith("step-00000004.damaged-")
    lines = [line for line in capsys.readouterr().out.splitlines() if "damaged" in line]
    assert lines == [
        f"checkpoint {newest} is damaged ({newest}/weights.txt does not match its checkpoint "
        f"record): moved aside to {mine.url}/{moved}, not resumed; resuming from checkpoint "
        f"{older} (step 2) instead"
    ]
    # Kept, never resumed, never removed by the checkpoints that follow or the stage's end.
    assert store.exists(f"{mine.url}/{moved}/weights.txt")
    assert latest_checkpoint(mine)[0] == older
    publish_checkpoint(mine, files(tmp_path, "six"), step=6)
    assert latest_checkpoint(mine)[1]["step"] == 6
    remove_checkpoints(store, mine.url.rsplit("/", 1)[0])
    assert latest_checkpoint(mine) is None
    assert set_aside_folders(store, mine) == [moved]


def test_a_damaged_only_checkpoint_starts_the_stage_at_step_0_and_the_re_run_too(tmp_path, capsys):
    mine = plan(tmp_path, "key-a")
    store = ArtifactStore(mine.store_url)
    url = publish_checkpoint(mine, files(tmp_path, "four"), step=4)
    flip_a_byte(store, f"{url}/weights.txt")
    assert pull_trainer_checkpoint(mine, tmp_path / "work") is None
    out = capsys.readouterr().out
    assert f"checkpoint {url} is damaged" in out and out.rstrip().endswith(
        "resuming from step 0 instead"
    )
    assert pull_trainer_checkpoint(mine, tmp_path / "work") is None  # no longer in the way
    assert capsys.readouterr().out == ""
    assert len(set_aside_folders(store, mine)) == 1


def test_a_checkpoint_whose_record_does_not_parse_is_set_aside(tmp_path, capsys):
    mine = plan(tmp_path, "key-a")
    store = ArtifactStore(mine.store_url)
    url = publish_checkpoint(mine, files(tmp_path, "four"), step=4)
    store.write_text(f"{url}/_CHECKPOINT.json", '{"key": "key-a", "st')
    assert latest_checkpoint(mine) is None
    assert "_CHECKPOINT.json does not parse" in capsys.readouterr().out
    assert len(set_aside_folders(store, mine)) == 1


def test_a_checkpoint_missing_a_file_is_damaged(tmp_path):
    mine = plan(tmp_path, "key-a")
    store = ArtifactStore(mine.store_url)
    url = publish_checkpoint(mine, files(tmp_path, "four"), step=4)
    store.remove(f"{url}/weights.txt")
    with pytest.raises(DamagedCheckpoint, match="weights.txt is missing"):
        download_checkpoint(mine, url, latest_checkpoint(mine)[1], tmp_path / "pulled")


def test_trainer_pickles_are_stored_as_safetensors_and_json_and_restored(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    state = optimizer_like_state()
    del state["flags"]  # a numpy scalar: not in what the Trainer saves, nor allowed to load
    torch.save(state, folder / "rng_state.pth")
    torch.save({"step": torch.tensor(3)}, folder / "optimizer.pt")
    torch.save({"anything": "pickled"}, folder / "training_args.bin")
    (folder / "trainer_state.json").write_text("{}")
    (tmp_path / "scratch").mkdir()
    stored = trainer_files(folder, tmp_path / "scratch")
    assert sorted(stored) == [
        "optimizer.pt.state.json", "optimizer.pt.state.safetensors",
        "rng_state.pth.state.json", "rng_state.pth.state.safetensors", "trainer_state.json",
    ]  # fmt: skip

    mine = plan(tmp_path, "key-a")
    publish_checkpoint(mine, stored, step=3)
    store = ArtifactStore(mine.store_url)
    assert not [u for u in store.list_files(mine.url) if u.endswith((".pt", ".pth", ".bin"))]
    local = pull_trainer_checkpoint(mine, tmp_path / "work")
    assert local == str(tmp_path / "work" / "checkpoint-3")
    pulled = tmp_path / "work" / "checkpoint-3"
    assert sorted(p.name for p in pulled.iterdir()) == [
        "optimizer.pt", "rng_state.pth", "trainer_state.json"
    ]  # fmt: skip
    # the Trainer loads them with weights_only=True, as transformers does
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():
        restored = torch.load(pulled / "rng_state.pth", weights_only=True)
    assert_same(restored, state)


def test_restoring_twice_is_harmless(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    torch.save({"step": torch.tensor(1)}, folder / "optimizer.pt")
    (tmp_path / "s").mkdir()
    stored = trainer_files(folder, tmp_path / "s")
    pulled = tmp_path / "pulled"
    pulled.mkdir()
    for name, path in stored.items():
        (pulled / name).write_bytes(path.read_bytes())
    restore_trainer_files(pulled)
    restore_trainer_files(pulled)
    assert [p.name for p in pulled.iterdir()] == ["optimizer.pt"]


class Run:
    def __init__(self, tmp_path, key):
        self.store = ArtifactStore(str(tmp_path / "store"))
        self.url, self.key = self.store.url("sft"), key

    def file(self, name):
        return f"{self.url}/{name}"


def test_a_stage_checkpoints_only_under_its_key_and_removes_its_checkpoints(tmp_path):
    run = Run(tmp_path, "key-a")
    assert checkpoint_plan(run, 50) == CheckpointPlan(
        store_url=run.store.root, url=f"{run.url}/checkpoint", key="key-a", every_steps=50
    )
    assert checkpoint_plan(run, 0) is None  # turned off
    assert checkpoint_plan(run, 0, 0.0) is None
    assert checkpoint_plan(run, 0, 30.0).every_minutes == 30.0  # by time only
    assert checkpoint_plan(Run(tmp_path, None), 50) is None  # a bare body has no key
    publish_checkpoint(checkpoint_plan(run, 50), files(tmp_path, "x"), step=1)
    run.store.write_text(run.file("model/config.json"), "{}")
    remove_checkpoints(run.store, run.url)
    assert run.store.list_files(run.url) == [run.file("model/config.json")]


def test_the_trainer_saves_every_n_steps_only_with_a_plan():
    job = TrainingJob(model_dir="m", data_file="d", output_dir="/o", settings=SFTSettings(), seed=0)
    assert checkpointing(job) == {"save_strategy": "no"}
    job.checkpoint = CheckpointPlan(
        store_url="file:///s", url="file:///s/c", key="k", every_steps=25
    )
    assert checkpointing(job) == {
        "save_strategy": "steps", "save_steps": 25, "save_total_limit": 1
    }  # fmt: skip


def test_the_trainer_saves_only_by_time_when_no_step_interval_is_set():
    job = TrainingJob(model_dir="m", data_file="d", output_dir="/o", settings=SFTSettings(), seed=0)
    job.checkpoint = CheckpointPlan(
        store_url="file:///s", url="file:///s/c", key="k", every_minutes=30
    )
    # the mirroring callback asks for the saves; the Trainer keeps only the newest on its disk
    assert checkpointing(job) == {"save_strategy": "no", "save_total_limit": 1}


def test_a_plan_that_would_never_save_is_refused():
    with pytest.raises(ValueError, match="every_steps or every_minutes"):
        CheckpointPlan(store_url="file:///s", url="file:///s/c", key="k")


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_checkpoint_is_due_every_n_steps_and_after_the_interval_since_the_last():
    clock = FakeClock()
    both = CheckpointPlan(
        store_url="file:///s", url="file:///s/c", key="k", every_steps=50, every_minutes=30
    )
    due = CheckpointClock(both, clock)
    assert [step for step in range(1, 120) if due.due(step)] == [50, 100]
    clock.now += 29 * 60
    assert not due.due(7)
    clock.now += 60  # 30 minutes since the start
    assert due.due(7) and due.due(8)  # stays due until a save is recorded
    due.saved()
    assert not due.due(9)
    clock.now += 30 * 60 - 1
    assert not due.due(10)
    clock.now += 1
    assert due.due(10)
    by_steps_only = CheckpointClock(both.model_copy(update={"every_minutes": 0}), clock)
    clock.now += 10**6
    assert not by_steps_only.due(7) and by_steps_only.due(50)
    by_time_only = CheckpointClock(both.model_copy(update={"every_steps": 0}), clock)
    assert not by_time_only.due(50)


def test_the_trainer_callback_asks_for_a_save_when_the_interval_has_passed(tmp_path):
    from types import SimpleNamespace

    from transformers import TrainerControl

    clock = FakeClock()
    by_time = CheckpointPlan(store_url="file:///s", url="file:///s/c", key="k", every_minutes=10)
    mirror = mirroring_callback(by_time, clock)
    state = SimpleNamespace(global_step=3, max_steps=8)
    control = TrainerControl()
    mirror.on_step_end(None, state, control)
    assert not control.should_save
    clock.now += 10 * 60
    mirror.on_step_end(None, state, control)
    assert control.should_save
    control = TrainerControl()
    mirror.on_step_end(None, SimpleNamespace(global_step=8, max_steps=8), control)
    assert not control.should_save  # the last step: the model itself is saved next
    mirror.due.saved()
    mirror.on_step_end(None, state, control)
    assert not control.should_save


def test_rl_checkpoints_when_the_interval_has_passed(monkeypatch):
    import training.rl as rl

    saved_at = []
    monkeypatch.setattr(rl, "save_checkpoint", lambda progress, *_: saved_at.append(progress.step))
    clock = FakeClock()
    progress = rl.Progress(seed=0, plan=CheckpointPlan(
        store_url="file:///s", url="file:///s/c", key="k", every_steps=4, every_minutes=5
    ))  # fmt: skip
    progress.clock = CheckpointClock(progress.plan, clock)
    for step in range(1, 10):
        progress.step = step
        clock.now += 60 if step != 6 else 5 * 60  # step 6 takes 5 minutes
        progress.maybe_checkpoint(None, None, None, None)
    # step 4 by steps (its clock reset), step 6 by time, step 8 by steps
    assert saved_at == [4, 6, 8] and progress.checkpoints_saved == 3


def test_a_resumed_rl_stage_trains_the_batches_it_had_not_trained_yet():
    from training import rl

    settings = RLSettings(epochs=2, batch_size=2)
    # The killed run and the resumed one (a new process) each work the schedule out from the seed.
    killed = rl.optimizer_schedule(settings, 7, processes=1, seed=5)
    resumed = rl.optimizer_schedule(settings, 7, processes=1, seed=5)
    done = 4  # optimizer steps in the checkpoint: the first epoch and one batch of the second
    assert killed[:done] + rl.batches_left(resumed, done) == killed
    assert rl.batches_left(resumed, 0) == killed and rl.batches_left(resumed, len(killed)) == []


def test_an_rl_steps_numbers_are_trls_names_over_the_steps_rows():
    import time

    from training.rl import Progress, Rows, Sums, step_metrics

    rows = Rows(
        input_ids=[torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3, 4, 5]), torch.tensor([7, 8])],
        mask=torch.tensor([[True, True, False, False], [False, True, True, True], [True] * 4]),
        recorded_logp=torch.zeros(3, 4),
        rewards=torch.tensor([1.0, 0.0, 9.0]),
        groups=torch.tensor([0, 0, 1]),
    )
    advantages = torch.tensor([[0.5, 0.5, 9, 9], [9, -0.5, -0.5, -0.5], [9.0] * 4])
    sums = Sums(loss=0.25, steps=1, tokens=5, kl=0.5, clipped=1.0)
    numbers = step_metrics(rows, advantages, [0, 1], sums, torch.tensor(2.0), 1e-3,
                           time.perf_counter() - 1.0)  # fmt: skip
    assert 7.0 < numbers.pop("tokens_per_second") <= 8.0  # 8 tokens in a bit over 1 s
    assert numbers == pytest.approx({
        "loss": 0.25, "kl": 0.1, "clip_ratio/region_mean": 0.2, "grad_norm": 2.0,
        "learning_rate": 1e-3, "reward": 0.5, "reward_std": 2**-0.5,
        "advantages/mean": -0.1, "advantages/std": (0.3 / 4) ** 0.5 * 2,
        "advantages/min": -0.5, "advantages/max": 0.5, "step_tokens": 8,
    })  # fmt: skip
    logged = []
    progress = Progress(seed=0, log_step=logged.append)
    for step in (1, 2):
        progress.step = step
        progress.record({"loss": 0.1 * step, "step_tokens": 8})
    assert logged == progress.history == [
        {"step": 1, "loss": 0.1, "num_tokens": 8}, {"step": 2, "loss": 0.2, "num_tokens": 16}
    ]  # fmt: skip


# What a checkpoint setting does to the stage's key ------------------------------------------


class TrainInputs(BaseModel):
    """A training stage's inputs: a model and data URL, its settings, a seed."""

    model_url: str
    settings: SFTSettings
    seed: int


trained: list[TrainInputs] = []


@stage("train-toy")
def train_toy_stage(inputs: TrainInputs, run) -> StageResult:
    trained.append(inputs)
    return StageResult(files={"model": run.store.write_text(run.file("model.txt"), "weights")})


@pytest.mark.parametrize(
    "inputs",
    [
        SFTInputs(model_url="m", data_url="d", settings=SFTSettings(), seed=0),
        DPOInputs(model_url="m", pairs_urls=["p"], settings=DPOSettings(), seed=0),
        RLInputs(model_url="m", data_url="d", settings=RLSettings(), seed=0),
    ],
)
def test_how_often_a_stage_checkpoints_is_not_in_its_key_what_it_trains_is(inputs, tmp_path):
    store = ArtifactStore(str(tmp_path))

    def key(**settings) -> str:
        changed = inputs.model_copy(
            update={"settings": inputs.settings.model_copy(update=settings)}
        )
        return store.stage_key(cache_inputs("train", changed))[0]

    assert key(checkpoint_every_steps=7) == key() == key(checkpoint_every_steps=0)
    assert key(learning_rate=3e-5) != key()
    assert "checkpoint_every_steps" not in cache_inputs("train", inputs)["settings"]
    assert (
        cache_inputs("train", inputs)["settings"]["learning_rate"] == inputs.settings.learning_rate
    )


def test_a_finished_stage_stays_cached_for_run_and_status_when_checkpoints_change(tmp_path):
    trained.clear()
    store = ArtifactStore(str(tmp_path))
    out = StageOutput(store_url=store.root, url=store.url("run/sft"))
    inputs = TrainInputs(model_url="m", settings=SFTSettings(checkpoint_every_steps=50), seed=0)
    train_toy_stage.fn(inputs, out)

    def with_settings(**settings) -> TrainInputs:
        return inputs.model_copy(update={"settings": inputs.settings.model_copy(update=settings)})

    # `flywheel status` answers each stage from its manifest as a run would
    planner = Planner(store)
    with planning(planner):
        train_toy_stage.fn(with_settings(checkpoint_every_steps=5), out)
    assert (planner.statuses[out.url].state, planner.statuses[out.url].reasons) == ("cached", [])
    with planning(planner):
        train_toy_stage.fn(with_settings(learning_rate=3e-5), out)
    assert planner.statuses[out.url].reasons == ["setting settings.learning_rate: 0.0001 → 3e-05"]
    # and a run serves it from the store
    assert train_toy_stage.fn(with_settings(checkpoint_every_steps=5), out).served_from_store
    assert len(trained) == 1


def agree_over_two_processes(rank: int, init_file: str, results) -> None:
    from training.checkpoint import on_any_process

    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2
    )
    try:
        # only process 0's clock has passed the interval: both must save, or their collectives
        # (the save's barrier, DDP's next all-reduce) would wait on each other forever
        results[rank] = (on_any_process(rank == 0), on_any_process(False))
    finally:
        torch.distributed.destroy_process_group()


def test_a_save_due_on_one_process_is_due_on_every_process(tmp_path):
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(
            agree_over_two_processes, args=(str(tmp_path / "init"), results), nprocs=2, join=True
        )
        assert dict(results) == {0: (True, False), 1: (True, False)}
