"""A flow process killed outright (SIGKILL, the OOM killer) leaves its Prefect flow runs Crashed,
not Running forever: its watchdog sets them so (flywheel/watchdog.py) through Prefect's
temporary server, which runs in a session of its own and outlives the flow, before it stops
that server. The runner tells the watchdog of each flow run (`ops.runner.watch_flow_run`)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent

# A recipe-like flow and its stages subflow, each told to the watchdog as the runner does.
SLEEPING_FLOW = """
import time

import flows  # noqa: F401  (every flow's Prefect settings)
from prefect import flow, runtime
from flywheel.watchdog import watchdog
from ops.runner import watch_flow_run
from ops.shutdown import flow_process

@flow(name="stages")
def stages():
    watch_flow_run()
    print("running", watchdog().process.pid, outer, runtime.flow_run.id, flush=True)
    time.sleep(600)

@flow(name="recipe")
def recipe():
    global outer
    outer = runtime.flow_run.id
    watch_flow_run()
    stages()

with flow_process():
    recipe(return_state=True)
"""


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_sigkilled_flows_runs_end_crashed_not_running(tmp_path):
    stderr = tmp_path / "flow-stderr.log"
    with stderr.open("w") as err:
        flow = subprocess.Popen(
            [sys.executable, "-c", SLEEPING_FLOW], cwd=REPO, stdout=subprocess.PIPE, stderr=err,
            text=True, env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"},
        )  # fmt: skip
    try:
        line = flow.stdout.readline()
        assert line.startswith("running"), line + stderr.read_text()[-3000:]
        _, watchdog_pid, *run_ids = line.split()
        flow.send_signal(signal.SIGKILL)
        flow.wait()
        deadline = time.monotonic() + 60
        while not is_gone(int(watchdog_pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert is_gone(int(watchdog_pid)), "the watchdog did not finish in 60 s"
    finally:
        if flow.poll() is None:
            flow.kill()
            flow.wait()
    database = sqlite3.connect(Path(os.environ["PREFECT_HOME"]) / "prefect.db")
    with database:
        states = dict(
            database.execute(
                f"select id, state_type from flow_run where id in ({', '.join('?' * 2)})",
                run_ids,
            ).fetchall()
        )
    assert states == dict.fromkeys(run_ids, "CRASHED"), stderr.read_text()[-3000:]
