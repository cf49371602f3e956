"""Checkpoints a training stage resumes from after it was killed, kept in the stage's folder in
the artifact store (`<stage url>/checkpoint/step-<n>/`), so a re-run on another machine resumes
too.

A checkpoint is published like a stage: its files first, `_CHECKPOINT.json` last (the stage's
cache key, the step, and the size and sha256 of every file). A folder without that record is a
checkpoint cut short and never counts; one whose key is not the running stage's (other inputs,
settings or code) is removed, never resumed. One whose files or record do not match (a flipped
byte) is moved aside, `step-<n>.damaged-<utc>`, never resumed nor deleted, and the stage resumes
from the next older one or step 0 (`pull_checkpoint`). After a new checkpoint is published the
older ones go, and the stage removes the last one when it publishes its model
(`remove_checkpoints`).

Nothing in the store is a pickle. Torch-pickled state (the Trainer's `optimizer.pt`,
`scheduler.pt`, `rng_state.pth`) is stored as `<name>.state.safetensors` (its tensors) and
`<name>.state.json` (everything else, `encode_state`), and turned back into the Trainer's files
on the local disk when a stage resumes. docs/checkpoints.md says why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from safetensors.torch import load_file, save_file

from flywheel.storage import ArtifactStore, hash_local_file

COMPLETE = "_CHECKPOINT.json"  # written last: a step folder without it is incomplete
STEP_PREFIX = "step-"
# A step folder; not a damaged one set aside, `step-<n>.damaged-<utc>`.
STEP_FOLDER = re.compile(r"step-\d+")
DAMAGED = ".damaged-"
PICKLED = (".pt", ".pth", ".bin")  # torch.save files a Trainer writes
STATE_SUFFIX = ".state"  # `optimizer.pt` is stored as optimizer.pt.state.{safetensors,json}
NOT_STORED = ("training_args.bin",)  # the Trainer's pickled arguments: not needed to resume


class CheckpointPlan(BaseModel):
    """Where and how often a trainer checkpoints; in the job file (`TrainingJob.checkpoint`,
    None where it does not)."""

    model_config = ConfigDict(extra="forbid")

    store_url: str  # the artifact store's root
    url: str  # <stage url>/checkpoint
    key: str  # the stage's cache key: a checkpoint for another key is never resumed
    every_steps: int = Field(default=0, ge=0)  # optimizer steps between checkpoints; 0: none
    # Also once this long has passed since the last checkpoint (or the start); 0: never by time.
    every_minutes: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _saves_at_all(self):
        if not (self.every_steps or self.every_minutes):
            raise ValueError("a checkpoint plan needs every_steps or every_minutes above 0")
        return self


def checkpoint_plan(run, every_steps: int, every_minutes: float = 0.0) -> CheckpointPlan | None:
    """The plan for a stage's trainer: checkpoint into `<run.url>/checkpoint` under the stage's
    key. None where the stage runs without a key (its bare body) or checkpoints off."""
    key = getattr(run, "key", None)
    if not key or (every_steps <= 0 and every_minutes <= 0):
        return None
    return CheckpointPlan(
        store_url=run.store.root, url=run.file("checkpoint"), key=key,
        every_steps=max(every_steps, 0), every_minutes=max(every_minutes, 0.0),
    )  # fmt: skip


class CheckpointClock:
    """When a trainer's next checkpoint is due: every `plan.every_steps` optimizer steps, and
    whenever `plan.every_minutes` have passed since the last one (or the start), so that slow
    steps (a large model, a loaded machine) still checkpoint. Every process must save at the
    same step and their clocks differ, so the time test is agreed over all processes: one
    process past the interval makes the save due for all. Call it at every step on every
    process."""

    def __init__(self, plan: CheckpointPlan, clock=time.monotonic):
        self.plan, self.clock = plan, clock
        self.last = clock()

    def due(self, step: int) -> bool:
        by_time = self.due_by_time()  # first: a collective every process must enter
        return by_time or bool(self.plan.every_steps) and step % self.plan.every_steps == 0

    def due_by_time(self) -> bool:
        if not self.plan.every_minutes:
            return False
        return on_any_process(self.clock() - self.last >= self.plan.every_minutes * 60)

    def saved(self) -> None:
        self.last = self.clock()


def on_any_process(flag: bool) -> bool:
    """`flag` or-ed over the processes of a distributed run (itself when there is one)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    on_gpu = torch.distributed.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    value = torch.tensor([int(flag)], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


# Pickle-free state: tensors in safetensors, the rest as JSON --------------------------------


class UnstorableState(TypeError):
    """A state holds a type `encode_state` cannot write without pickling it."""


def encode_state(value, tensors: dict[str, torch.Tensor]):
    """`value` (nested dicts, lists, tuples, tensors, numpy arrays and plain values) as JSON, its
    tensors moved into `tensors` under numbered names. Containers are tagged so that tuples stay
    tuples and dict keys keep their type (an optimizer's state is keyed by int)."""
    if isinstance(value, torch.Tensor):
        name = str(len(tensors))
        tensors[name] = value.detach().cpu().contiguous()
        return {"tensor": name}
    if isinstance(value, np.ndarray):
        name = str(len(tensors))
        tensors[name] = torch.from_numpy(np.ascontiguousarray(value))
        return {"ndarray": name, "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return {"npscalar": value.item(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {
            "dict": [[encode_state(k, tensors), encode_state(v, tensors)] for k, v in value.items()]
        }
    if isinstance(value, list | tuple):
        tag = "tuple" if isinstance(value, tuple) else "list"
        return {tag: [encode_state(v, tensors) for v in value]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise UnstorableState(f"cannot store a {type(value).__name__} without pickling it")


def decode_state(tree, tensors: dict[str, torch.Tensor]):
    """The value `encode_state` wrote."""
    if not isinstance(tree, dict):
        return tree
    if "tensor" in tree:
        return tensors[tree["tensor"]]
    if "ndarray" in tree:
        return tensors[tree["ndarray"]].numpy().astype(tree["dtype"])
    if "npscalar" in tree:
        return np.dtype(tree["dtype"]).type(tree["npscalar"])
    if "dict" in tree:
        return {decode_state(k, tensors): decode_state(v, tensors) for k, v in tree["dict"]}
    if "tuple" in tree:
        return tuple(decode_state(v, tensors) for v in tree["tuple"])
    return [decode_state(v, tensors) for v in tree["list"]]


def save_state(value, folder: Path, name: str) -> list[Path]:
    """Write `value` as `<name>.safetensors` + `<name>.json` in `folder`."""
    tensors: dict[str, torch.Tensor] = {}
    tree = encode_state(value, tensors)
    paths = [Path(folder) / f"{name}.safetensors", Path(folder) / f"{name}.json"]
    save_file(tensors, str(paths[0]))
    paths[1].write_text(json.dumps(tree))
    return paths


def load_state(folder: Path, name: str):
    tensors = load_file(str(Path(folder) / f"{name}.safetensors"))
    return decode_state(json.loads((Path(folder) / f"{name}.json").read_text()), tensors)


# Publishing and finding checkpoints in the store -------------------------------------------


def step_url(plan: CheckpointPlan, step: int) -> str:
    return f"{plan.url}/{STEP_PREFIX}{step:08d}"


def publish_checkpoint(plan: CheckpointPlan, files: dict[str, Path], step: int) -> str:
    """Upload `files` (name in the checkpoint -> local path) as the checkpoint of `step`, its
    record last, then remove every other checkpoint of the stage. Returns its URL."""
    store = ArtifactStore(plan.store_url)
    target = step_url(plan, step)
    remove_folder(store, target)  # a cut-short attempt at the same step
    digests = {}
    for name, path in sorted(files.items()):
        url = f"{target}/{name}"
        store.fs.makedirs(store._path(url).rsplit("/", 1)[0], exist_ok=True)
        store.fs.put_file(str(path), store._path(url))
        digests[name] = hash_local_file(str(path)).model_dump()
    record = {"key": plan.key, "step": step, "files": digests}
    store.write_text(f"{target}/{COMPLETE}", json.dumps(record, indent=2))
    for other in step_folders(store, plan.url):
        if other != target:
            remove_folder(store, other)
    return target


def remove_folder(store: ArtifactStore, url: str) -> None:
    if store.exists(url):
        store.fs.rm(store._path(url), recursive=True)


def step_folders(store: ArtifactStore, url: str) -> list[str]:
    if not store.exists(url):
        return []
    names = {u[len(url) + 1 :].split("/", 1)[0] for u in store.list_files(url)}
    return sorted(f"{url}/{n}" for n in names if STEP_FOLDER.fullmatch(n))


class DamagedCheckpoint(ValueError):
    """A checkpoint whose record does not parse, or whose files do not match their record."""


def latest_checkpoint(plan: CheckpointPlan) -> tuple[str, dict] | None:
    """The newest complete checkpoint written for `plan.key` (its URL and record). Checkpoints
    cut short or written for another key are removed on the way, and said so; one whose record
    is damaged is moved aside (`set_aside`)."""
    store = ArtifactStore(plan.store_url)
    found, damaged = [], []
    for folder in step_folders(store, plan.url):
        try:
            record = read_record(store, folder)
        except DamagedCheckpoint as error:
            damaged.append((folder, error, set_aside(store, folder)))
            continue
        if record is None:
            print(f"checkpoint {folder} is incomplete (no {COMPLETE}): removed")
        elif record["key"] != plan.key:
            print(
                f"checkpoint {folder} was written for other inputs (key {record['key']}, this "
                f"stage's is {plan.key}): removed, not resumed"
            )
        else:
            found.append((record["step"], folder, record))
            continue
        remove_folder(store, folder)
    newest = max(found)[1:] if found else None
    for folder, error, moved in damaged:
        print(damaged_line(folder, error, moved, newest))
    return newest


def read_record(store: ArtifactStore, folder: str) -> dict | None:
    """The checkpoint's record; None when it has none (cut short)."""
    url = f"{folder}/{COMPLETE}"
    if not store.exists(url):
        return None
    try:
        with store.fs.open(store._path(url)) as f:
            record = json.loads(f.read())
    except ValueError as error:
        raise DamagedCheckpoint(f"its {COMPLETE} does not parse: {error}") from None
    if not isinstance(record, dict) or not {"key", "step", "files"} <= set(record):
        raise DamagedCheckpoint(f"its {COMPLETE} lacks key, step or files")
    return record


def set_aside(store: ArtifactStore, folder: str) -> str:
    """Move a damaged checkpoint to `<folder>.damaged-<utc>`, where no stage resumes from it and
    nothing removes it: what damaged it may want looking into."""
    moved = f"{folder}{DAMAGED}{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}"
    store.fs.mv(store._path(folder), store._path(moved), recursive=True)
    return moved


def damaged_line(folder: str, error: Exception, moved: str, instead: tuple | None) -> str:
    """The one line a damaged checkpoint gets: which, why, where it went, what is resumed."""
    resumed = f"checkpoint {instead[0]} (step {instead[1]['step']})" if instead else "step 0"
    return (
        f"checkpoint {folder} is damaged ({error}): moved aside to {moved}, not resumed; "
        f"resuming from {resumed} instead"
    )


def pull_checkpoint(plan: CheckpointPlan, target: Path) -> tuple[str, dict, Path] | None:
    """The newest checkpoint for `plan.key` whose files match its record, pulled into `target`
    (its URL, record and local folder); None to start from step 0. A damaged one is moved aside
    and the next older one tried."""
    store = ArtifactStore(plan.store_url)
    found = latest_checkpoint(plan)
    while found is not None:
        folder, record = found
        try:
            return folder, record, download_checkpoint(plan, folder, record, target)
        except DamagedCheckpoint as error:
            moved = set_aside(store, folder)
            found = latest_checkpoint(plan)
            print(damaged_line(folder, error, moved, found))
    return None


def download_checkpoint(plan: CheckpointPlan, folder_url: str, record: dict, target: Path) -> Path:
    """The checkpoint's files in the local folder `target`, each checked against its record.
    Written beside `target` and renamed into place, so a pull cut short leaves nothing."""
    store = ArtifactStore(plan.store_url)
    target = Path(target)
    part = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    try:
        for name, expected in record["files"].items():
            local = part / name
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                store.fs.get_file(store._path(f"{folder_url}/{name}"), str(local))
            except FileNotFoundError:
                raise DamagedCheckpoint(f"{folder_url}/{name} is missing") from None
            found = hash_local_file(str(local))
            if (found.size, found.sha256) != (expected["size"], expected["sha256"]):
                raise DamagedCheckpoint(f"{folder_url}/{name} does not match its checkpoint record")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(part, target)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return target


def remove_checkpoints(store: ArtifactStore, stage_url: str) -> None:
    """A stage's checkpoints, removed once its model is in the store (before it publishes); the
    damaged ones set aside stay (`set_aside`)."""
    url = f"{stage_url}/checkpoint"
    for folder in step_folders(store, url):
        remove_folder(store, folder)
    if store.exists(url) and not store.list_files(url):
        remove_folder(store, url)


# The Trainer's checkpoint folders (SFT, DPO) ------------------------------------------------


def trainer_files(folder: Path, scratch: Path) -> dict[str, Path]:
    """The files of a Trainer checkpoint folder as stored: pickles converted into state files
    in `scratch`, the Trainer's pickled arguments left out, the rest as they are."""
    from transformers.trainer_pt_utils import safe_globals

    files = {}
    for path in sorted(Path(folder).rglob("*")):
        name = path.relative_to(folder).as_posix()
        if not path.is_file() or path.name in NOT_STORED:
            continue
        if path.suffix not in PICKLED:
            files[name] = path
            continue
        # Our own process wrote it a moment ago; weights_only refuses anything but tensors and
        # plain values (and numpy's RNG state, allowed as the Trainer allows it to load it).
        with safe_globals():
            value = torch.load(path, map_location="cpu", weights_only=True)
        stored = scratch / (name + STATE_SUFFIX)
        stored.parent.mkdir(parents=True, exist_ok=True)
        for written in save_state(value, stored.parent, stored.name):
            files[written.relative_to(scratch).as_posix()] = written
    return files


def restore_trainer_files(folder: Path) -> None:
    """Turn the stored state files of a pulled checkpoint back into the Trainer's own files."""
    for tree in sorted(Path(folder).rglob(f"*{STATE_SUFFIX}.json")):
        stem = tree.name.removesuffix(".json")
        value = load_state(tree.parent, stem)
        torch.save(value, tree.parent / stem.removesuffix(STATE_SUFFIX))
        tree.unlink()
        (tree.parent / f"{stem}.safetensors").unlink()


def pull_trainer_checkpoint(plan: CheckpointPlan | None, work_dir: Path) -> str | None:
    """The local Trainer checkpoint folder to resume from (`resume_from_checkpoint`), pulled
    from the store; None to start from step 0."""
    if plan is None:
        return None
    found = pull_checkpoint(plan, Path(work_dir) / "checkpoint-pulled")
    if found is None:
        return None
    folder_url, record, pulled = found
    local = Path(work_dir) / f"checkpoint-{record['step']}"  # the Trainer's own name for it
    shutil.rmtree(local, ignore_errors=True)
    pulled.rename(local)
    restore_trainer_files(local)
    print(f"resuming from checkpoint {folder_url} (optimizer step {record['step']})")
    return str(local)


def mirroring_callback(plan: CheckpointPlan, clock=time.monotonic):
    """A TrainerCallback that publishes every checkpoint the Trainer saves into the store, and
    has it save when `plan.every_minutes` have passed (the Trainer's `save_steps` does the rest)."""
    from transformers import TrainerCallback

    class MirrorCheckpoints(TrainerCallback):
        """Also times each checkpoint, from the step's end (the Trainer's own save follows it)
        to the store's copy published: `saves`, `seconds`."""

        def __init__(self):
            self.saves, self.seconds, self.step_ended = 0, 0.0, 0.0
            self.due = CheckpointClock(plan, clock)

        def on_step_end(self, args, state, control, **kwargs):
            self.step_ended = time.perf_counter()
            if state.global_step >= state.max_steps:  # the model itself is saved next
                control.should_save = False
            elif self.due.due_by_time():
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            wait_for_every_process()  # each process's RNG file is written
            if state.is_world_process_zero:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                with tempfile.TemporaryDirectory(dir=args.output_dir) as scratch:
                    files = trainer_files(folder, Path(scratch))
                    publish_checkpoint(plan, files, state.global_step)
            wait_for_every_process()
            self.due.saved()
            self.saves += 1
            self.seconds += time.perf_counter() - self.step_ended

    return MirrorCheckpoints()


def wait_for_every_process() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
