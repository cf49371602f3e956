"""Start a trainer entry point in its own process: plain Python, or N processes (`accelerate
launch` on GPUs, torchrun with gloo on a CPU).

Output goes to a log file next to the job (and to this process's stdout, so it shows in Prefect's
logs); a failure raises with the log's tail so the failed stage says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from flywheel.settings import accelerate_config_file
from flywheel.stopping import refuse_if_stopping


def command(
    module: str, job_file: Path, num_processes: int, accelerate_config: str | None
) -> list[str]:
    if num_processes <= 1 and accelerate_config is None:
        return [sys.executable, "-m", module, "--config", str(job_file)]
    import torch

    gpu = torch.cuda.is_available()
    if not gpu and accelerate_config is None:
        # accelerate's CPU launcher starts a single process unless MPI is set up; torchrun starts
        # N processes that the Trainer joins with gloo.
        return [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(num_processes),
            "-m", module, "--config", str(job_file),
        ]  # fmt: skip
    # as trl's bf16 (`trainer_defaults`): the job's resolved precision
    job = Path(job_file)  # absent only where a command is built to be shown, not run
    settings = json.loads(job.read_text()).get("settings", {}) if job.exists() else {}
    precision = "bf16" if settings.get("precision") == "bfloat16" else "no"
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", accelerate_config_file(accelerate_config or "ddp"),
        "--num_processes", str(num_processes), "--mixed_precision", precision,
        "-m", module, "--config", str(job_file),
    ]  # fmt: skip


# Trainers running now. Each is the leader of a process group of its own (torchrun and
# accelerate start workers beneath it), so stopping one stops the whole group.
_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()
STOP_GRACE_S = 5.0  # SIGTERM first; SIGKILL for a group still there after this


def launch(
    module: str,
    job_file: Path,
    log_file: Path,
    num_processes: int = 1,
    accelerate_config: str | None = None,
    extra_env: dict[str, str] | None = None,
    log_name: str | None = None,
) -> None:
    """Run the trainer, its output into `log_file`; a non-zero exit raises `TrainingFailed`
    naming the log as `log_name` (where it is kept; default `log_file`); once the run is
    stopping (`flywheel.stopping`), `RunStopped` instead of a start."""
    refuse_if_stopping(f"trainer {module}")
    env = {**os.environ, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
    cmd = command(module, job_file, num_processes, accelerate_config)
    with open(log_file, "w") as log:
        # A group of its own: stopping it stops torchrun's or accelerate's workers too, and a
        # Ctrl-C reaches it only through this process, which stops it (`stop_trainer`).
        process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
            start_new_session=True,
        )  # fmt: skip
        with _running_lock:
            _running.add(process)
        try:
            # A stop between the check above and the add was missed by `stop_trainers`.
            refuse_if_stopping(f"trainer {module}")
            for line in process.stdout:
                log.write(line)
                sys.stdout.write(line)
            code = process.wait()
        finally:  # a no-op after a normal end; after a signal or an error here, the group goes
            stop_trainer(process)
    if code != 0:
        log_text = Path(log_file).read_text(errors="replace")
        raise TrainingFailed(trainer_failure(module, code, log_text, log_name or str(log_file)))


class TrainingFailed(RuntimeError):
    """A trainer process exited non-zero. The message's first line is the trainer's own error
    and what to change; then where its whole log is kept, and the log's last lines."""


# Launchers' wrappers around a worker's error (torchrun, accelerate): the worker's is the cause.
LAUNCHER_ERRORS = re.compile(r"ChildFailedError|CalledProcessError")
RANK_PREFIX = re.compile(r"^\[(default)?rank\d+\]:\s?")
LOCAL_PATH = re.compile(r"(?<![\w:/])(/[^\s:'\"/]+)+/(?=[^\s/])")
# Causes a setting fixes: (what the cause says, what to change in the trainer's section).
FIXES = [
    (re.compile(r"max_length=\d+"), "raise {section}.max_length"),
    (re.compile(r"frozen_layers=\d+"), "lower {section}.frozen_layers"),
    (
        re.compile(r"out of memory|OutOfMemoryError", re.I),
        "lower {section}.batch_size or .max_length",
    ),
    # torch's strict deterministic mode (`deterministic: true`) meeting an op without such a kernel
    (
        re.compile(r"does not have a deterministic implementation"),
        "set {section}.deterministic=false",
    ),
]
SECTIONS = {
    "training.dpo": "dpo",
    "training.rl": "rl",
    "training.sft": "sft (revision_sft / rft for Agent-R's / ET-Agent's later SFT)",
}
CAUSE_CHARS = 160  # of the first line, which every short view (UI lists, tags) shows


def trainer_failure(module: str, code: int, log_text: str, log_name: str) -> str:
    """The failure as a person reads it: the cause and its fix first (short views cut the
    message after a line), then the exit code and where the log is, then its last lines."""
    lines = [RANK_PREFIX.sub("", line) for line in log_text.splitlines()]
    cause = LOCAL_PATH.sub("", exception_line(lines) or f"{module} exited with code {code}")
    section = SECTIONS.get(module)  # the settings of another module are not known here
    fixes = [fix.format(section=section) for pattern, fix in FIXES if pattern.search(cause)]
    head = with_fix(cause, fixes[0]) if fixes and section else cut(cause, CAUSE_CHARS)
    tail = "\n".join(log_text.splitlines()[-25:])
    return (
        f"{head}\n{module} exited with code {code}; its whole log: {log_name}\n"
        f"last lines of the log:\n{tail}"
    )


def with_fix(cause: str, fix: str) -> str:
    """`cause → fix`, the fix before the details in parentheses that end the cause (counts,
    shapes): short views cut the line after 30-70 characters, and the fix is what to do."""
    statement, paren, details = cause.partition(" (")
    head = f"{cut(statement, CAUSE_CHARS)} → {fix}"
    return head + cut(f" ({details}", CAUSE_CHARS - len(statement)) if paren else head


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def exception_line(lines: list[str]) -> str | None:
    """The error a Python traceback in `lines` ends with (`ValueError: ...`): the last one that
    is not a launcher's report of its worker's failure; else the log's last line."""
    errors, in_traceback = [], False
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and line.strip() and not line[0].isspace():
            errors.append(line.strip())
            in_traceback = False
    own = [error for error in errors if not LAUNCHER_ERRORS.search(error)]
    if own or errors:
        return (own or errors)[-1]
    last = [line.strip() for line in lines if line.strip()]
    return last[-1] if last else None


def stop_trainer(process: subprocess.Popen) -> None:
    """Stop a trainer's whole process group: SIGTERM, then SIGKILL after `STOP_GRACE_S`."""
    with _running_lock:
        _running.discard(process)
    if process.poll() is None:
        signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_GRACE_S)
    signal_group(process.pid, signal.SIGKILL)  # workers that outlived their leader, if any


def signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def stop_trainers() -> None:
    """Stop every trainer this process started (a flow told to stop)."""
    with _running_lock:
        running = list(_running)
    for process in running:
        stop_trainer(process)


def train_to_store(
    store,
    module: str,
    model_url: str,
    data_url: str,
    out_url: str,
    settings,
    seed: int,
    trl_args: dict,
    extra_env: dict[str, str] | None = None,
    checkpoint=None,
    reference_url: str | None = None,
) -> dict:
    """Train `model_url` on `data_url` with `module`, put the model folder at `out_url/model`.

    `settings` is the stage's `SFTSettings` / `DPOSettings` / `RLSettings`, handed to the trainer
    whole in its job file; `checkpoint` a `training.checkpoint.CheckpointPlan` or None;
    `reference_url` DPO's reference model where it is not `model_url`.

    Returns the metrics the trainer printed last. The model is written next to the store's
    files on a local store, and uploaded from a scratch folder otherwise.
    """
    import json
    import tempfile

    from flywheel.inference import release_vllm
    from flywheel.watchdog import watchdog
    from training.job import TrainingJob

    release_vllm()  # the trainer needs the memory the engine's KV cache holds

    with tempfile.TemporaryDirectory(prefix="flywheel-train-") as folder:
        scratch = Path(folder)  # job file, log, trl's work folder; removed when done
        watchdog().tell(temp_dir=folder)  # ... or by the watchdog if this process is killed
        output = store.write_dir(f"{out_url}/model") if store.is_local else scratch / "model"
        job = TrainingJob(
            model_dir=str(store.local_dir(model_url)),
            data_file=str(store.local_file(data_url)),
            output_dir=str(output),
            settings=settings,
            seed=seed,
            trl_args={**trl_args, "output_dir": str(scratch / "work")},
            checkpoint=checkpoint,
            reference_dir=str(store.local_dir(reference_url)) if reference_url else None,
        )
        metrics_file = scratch / "metrics.json"
        env = {**(extra_env or {}), "FLYWHEEL_METRICS_FILE": str(metrics_file)}
        log_file = scratch / "train.log"
        try:
            job_file = job.save(scratch / "job.json")
            launch(
                module, job_file, log_file, settings.num_processes, settings.accelerate_config, env,
                log_name=f"{out_url}/train.log",
            )  # fmt: skip
        finally:  # the log of a failed training is kept too (the message points at this copy)
            if log_file.exists():
                store.write_text(f"{out_url}/train.log", log_file.read_text())
        if not store.is_local:
            store.upload_dir(output, f"{out_url}/model")
        return json.loads(metrics_file.read_text()) if metrics_file.exists() else {}


def trained_model(
    run,
    module: str,
    model_url: str,
    data_url: str,
    settings,
    seed: int,
    trl_args: dict,
    reference_url: str | None = None,
):
    """The body of a training stage (`flywheel.stage.stage`): train into the stage's folder,
    logging into its MLflow run, checkpointing as `settings` say (removed once the model is in
    the store: nothing to resume), with `settings.lora`; the model, the log and the trainer's
    last metrics. `trl_args` are trl's arguments derived from `settings` (none for training.rl)."""
    from flywheel.stage import StageResult
    from training.checkpoint import checkpoint_plan, remove_checkpoints

    if settings.lora.enabled and settings.lora.publish == "adapter" and not run.store.is_local:
        raise ValueError(
            "lora.publish=adapter needs a local store (storage_url a folder): the adapter names "
            "its base by its path on this machine; use lora.publish=merged (docs/lora.md)"
        )
    checkpoint = checkpoint_plan(
        run, settings.checkpoint_every_steps, settings.checkpoint_every_minutes
    )
    metrics = train_to_store(
        run.store, module, model_url, data_url, run.url, settings, seed, trl_args,
        run.tracking_env(), checkpoint, reference_url=reference_url,
    )  # fmt: skip
    remove_checkpoints(run.store, run.url)
    return StageResult(
        files={"model": run.file("model"), "log": run.file("train.log")},
        metrics={k: float(v) for k, v in metrics.items() if isinstance(v, int | float)},
    )
