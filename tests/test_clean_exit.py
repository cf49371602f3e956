"""A flow process that ends cleanly leaves nothing for its watchdog: multiprocessing's resource
tracker (which vLLM and torch start) is stopped on the way out, not found running and stopped
by the watchdog a moment after the flow's exit."""

import subprocess
import sys
from pathlib import Path

from tests.fake_engine import ENGINE_WITH_WORKER

REPO = Path(__file__).resolve().parent.parent

FLOW_PROCESS = """
import time
from multiprocessing import resource_tracker
from ops.shutdown import flow_process

with flow_process():
    resource_tracker.ensure_running()  # as vLLM's and torch's semaphores start it
    time.sleep(1.5)  # the watchdog lists the flow's children every 0.5 s: it has seen it
print("flow done", flush=True)
"""


def run_clean_flow_process(script: str) -> subprocess.CompletedProcess:
    """Run `script` as a flow process; it must exit 0 with nothing left for its watchdog. The
    watchdog shares the child's stderr, so this returns once the watchdog has finished too."""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "flywheel watchdog" not in done.stderr, done.stderr
    return done


def test_a_clean_exit_leaves_no_process_for_the_watchdog():
    assert run_clean_flow_process(FLOW_PROCESS).stdout == "flow done\n"


def test_the_watchdog_counts_no_zombie_as_left_behind(capsys):
    import time

    import psutil

    from flywheel.watchdog import stop_leftovers

    child = subprocess.Popen(["true"])
    zombie = psutil.Process(child.pid)
    deadline = time.monotonic() + 10
    while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)  # exited, not yet reaped by us: a zombie
    stop_leftovers({child.pid: zombie.create_time()})
    child.wait()
    assert "flywheel watchdog" not in capsys.readouterr().err


# A flow whose shared engine (its core and the worker below it, `tests.fake_engine`) is still
# running when the flow ends.
FLOW_WITH_ENGINE = f"""
import subprocess, sys
from ops.shutdown import flow_process
from flywheel import inference

core = {ENGINE_WITH_WORKER!r}

class SharedEngine:  # the process's shared engine, as `shared_vllm` holds it
    def close(self):
        print("engine closed", flush=True)

with flow_process():
    engine = subprocess.Popen([sys.executable, "-c", core], stdout=subprocess.PIPE)
    worker_pid = engine.stdout.readline().decode().strip()
    inference._engine = ("model", SharedEngine())
print("worker", worker_pid, "engine left:", inference._engine, flush=True)
"""


def test_a_clean_exit_closes_the_engine_and_stops_a_worker_below_its_core():
    import psutil

    # The worker, a grandchild, is stopped by the flow itself, not left to its watchdog.
    done = run_clean_flow_process(FLOW_WITH_ENGINE)
    closed, last = done.stdout.splitlines()
    assert closed == "engine closed"  # the shared engine was released on the way out
    _, worker_pid, *_ = last.split()
    assert last.endswith("engine left: None")
    assert not psutil.pid_exists(int(worker_pid))
