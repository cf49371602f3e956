"""A real `python -m flows.eto` (tiny model, real vLLM and trl trainer), stopped with SIGTERM while
a trainer runs and killed with SIGKILL while vLLM's engine runs: no process, no temporary folder
left behind, and no MLflow run left RUNNING or marked FINISHED for what was cut short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CONFIG = """\
run_name: eto-kill
model: {base: tiny}
env: {train_tasks: 4, test_tasks: 3, max_steps: 3}
inference: {max_tokens: 24, kv_cache_gib: 1}
rounds: 1
sft: {epochs: 50, batch_size: 2, max_length: 1024}
dpo: {epochs: 1, max_length: 1024}
explore: {shards: 2}
"""


def described(process: psutil.Process) -> str:
    """Name and command line ("" for a process that is gone or a zombie)."""
    try:
        return f"{process.name()} {' '.join(process.cmdline())}"
    except psutil.Error:
        return ""


def is_trainer(process: psutil.Process) -> bool:
    return "training.sft" in described(process)


def is_vllm_engine(process: psutil.Process) -> bool:
    return "EngineCore" in described(process)


class FlowProcess:
    """The flow as a subprocess, every process it starts marked by an environment variable."""

    def __init__(self, tmp_path: Path):
        self.marker = uuid.uuid4().hex
        # The flow's TMPDIR: what is left in it was left behind. Short, as TMPDIRs are: vLLM's
        # socket paths inside it may not exceed 107 bytes.
        self.temp = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
        self.mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        config = tmp_path / "config.yaml"
        config.write_text(CONFIG)
        env = {
            **os.environ, "FLYWHEEL_KILL_TEST": self.marker, "TMPDIR": str(self.temp),
            "MLFLOW_TRACKING_URI": self.mlflow_uri, "PREFECT_HOME": str(tmp_path / "prefect"),
        }  # fmt: skip
        self.log = tmp_path / "flow.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "flows.eto", "--config", str(config),
                 f"storage_url={tmp_path / 'runs'}"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.seen: dict[int, float] = {}  # every descendant seen: pid -> start time

    def marked(self) -> list[psutil.Process]:
        """Every live process that carries this flow's marker (the flow's descendants; vLLM's
        engine renames itself, which hides its environment: `seen` has those)."""
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("FLYWHEEL_KILL_TEST") == self.marker:
                    found.append(process)
            except psutil.Error:
                pass
        return found

    def wait_for(self, wanted, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            children = psutil.Process(self.process.pid).children(recursive=True)
            self.seen.update({c.pid: c.create_time() for c in children})
            if any(wanted(c) for c in children):
                return
            time.sleep(0.2)
        raise AssertionError(f"never started; log:\n{self.log.read_text()[-3000:]}")

    def left_behind(self, within_s: float) -> list[str]:
        """What still runs `within_s` after the flow ended (the watchdog may need seconds)."""
        deadline = time.monotonic() + within_s
        while True:
            left = [p for p in self.marked() if p.pid != self.process.pid]
            for pid, started in self.seen.items():
                try:
                    process = psutil.Process(pid)
                    if abs(process.create_time() - started) < 1 and process not in left:
                        left.append(process)
                except psutil.Error:
                    pass
            if not left or time.monotonic() > deadline:
                return [f"{p.pid} {described(p)[:160]}" for p in left if described(p)]
            time.sleep(0.5)

    def temporary_files_left(self) -> list[str]:
        # torch keeps its compile cache in TMPDIR/torchinductor_<user> on purpose, for every run
        return [p.name for p in self.temp.iterdir() if not p.name.startswith("torchinductor_")]

    def mlflow_runs(self) -> dict[str, str]:
        """Status by run name; the flow run's parent run is "parent"."""
        client = MlflowClient(self.mlflow_uri)
        experiment = client.get_experiment_by_name("flywheel")
        return {
            "parent" if "mlflow.parentRunId" not in r.data.tags else r.data.tags["mlflow.runName"]:
            r.info.status
            for r in client.search_runs([experiment.experiment_id])
        }  # fmt: skip


@pytest.mark.extended
def test_sigterm_during_training_exits_in_seconds_and_leaves_nothing(tmp_path):
    flow = FlowProcess(tmp_path)
    flow.wait_for(is_trainer)
    time.sleep(3)  # the trainer is loading or training
    stopped_at = time.monotonic()
    flow.process.send_signal(signal.SIGTERM)
    code = flow.process.wait(timeout=120)
    took = time.monotonic() - stopped_at
    log = flow.log.read_text()
    print(f"SIGTERM -> exit {code} in {took:.1f} s")
    assert took < 30, log[-3000:]
    assert code != 0
    assert flow.left_behind(within_s=15) == [], log[-3000:]
    assert flow.temporary_files_left() == []
    runs = flow.mlflow_runs()
    assert runs["parent"] == "KILLED", runs
    assert runs["sft/expert"] in ("KILLED", "FAILED"), runs
    assert "RUNNING" not in runs.values(), runs


def test_sigkill_while_vllm_runs_leaves_nothing_running(tmp_path):
    flow = FlowProcess(tmp_path)
    flow.wait_for(is_vllm_engine)
    time.sleep(2)  # the watchdog looks every 0.5 s; vLLM's engine core is starting its worker
    flow.process.send_signal(signal.SIGKILL)
    flow.process.wait(timeout=30)
    log = flow.log.read_text()
    assert flow.left_behind(within_s=30) == [], log[-3000:]
    assert flow.temporary_files_left() == []
    runs = flow.mlflow_runs()
    assert runs["parent"] == "KILLED", runs
    # Stages that finished before the kill keep FINISHED; the one vLLM was serving was cut short.
    assert runs["evaluate/untrained"] == "KILLED", runs
    assert "RUNNING" not in runs.values(), runs
