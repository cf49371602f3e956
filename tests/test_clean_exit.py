"""A flow process that ends cleanly leaves nothing for its watchdog: multiprocessing's resource
tracker (which vLLM and torch start) is stopped on the way out, not found running and stopped
by the watchdog a moment after the flow's exit."""

import subprocess
import sys
from pathlib import Path

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


def test_a_clean_exit_leaves_no_process_for_the_watchdog():
    # The watchdog shares the child's stderr, so this returns once the watchdog has finished too.
    done = subprocess.run(
        [sys.executable, "-c", FLOW_PROCESS], cwd=REPO, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "flow done\n"
    assert "flywheel watchdog" not in done.stderr, done.stderr


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


# An engine core that starts a worker which ignores SIGTERM (as a busy one may not get to it);
# the worker prints its pid once it runs. Both wait, as a live engine does at the flow's end.
FLOW_WITH_ENGINE = """
import subprocess, sys
from ops.shutdown import flow_process
from flywheel import inference

core = '''
import ctypes, subprocess, sys, time
ctypes.CDLL(None).prctl(15, b"VLLM::EngineCor", 0, 0, 0)
worker = \\'\\'\\'
import ctypes, os, signal, time
ctypes.CDLL(None).prctl(15, b"VLLM::Worker", 0, 0, 0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(os.getpid(), flush=True)
time.sleep(120)
\\'\\'\\'
subprocess.Popen([sys.executable, "-c", worker], stdout=sys.stdout)
time.sleep(120)
'''

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

    done = subprocess.run(
        [sys.executable, "-c", FLOW_WITH_ENGINE], cwd=REPO, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    closed, last = done.stdout.splitlines()
    assert closed == "engine closed"  # the shared engine was released on the way out
    _, worker_pid, *_ = last.split()
    assert last.endswith("engine left: None")
    # The worker, a grandchild, was stopped by the flow itself, not left to its watchdog.
    assert "flywheel watchdog" not in done.stderr, done.stderr
    assert not psutil.pid_exists(int(worker_pid))
