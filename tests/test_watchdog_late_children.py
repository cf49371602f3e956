"""After a flow process is SIGKILLed, its watchdog (flywheel/watchdog.py) also stops a process
that one of the flow's children starts once the flow is dead: such a process is no descendant of
the flow any more (its parent dies and init adopts it), so only the mark in its environment
finds it. Plain python processes stand in for vLLM and trainers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent

# Started before the kill. Stopped by the watchdog (SIGTERM), it starts one more process, in a
# session of its own, and exits: that process is born after the flow's death and the watchdog's
# last look at the flow's descendants, and its parent is gone at once.
CHILD = """
import os, signal, subprocess, sys, time

def start_one_more_and_exit(*_):
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)
    with open(sys.argv[1] + "/late.pid", "w") as f:
        f.write(str(late.pid))
    os._exit(0)

signal.signal(signal.SIGTERM, start_one_more_and_exit)
print(os.getpid(), flush=True)
time.sleep(120)
"""

# The flow process: its watchdog started as the runner starts it, then a child.
FLOW = f"""
import subprocess, sys, time
from flywheel.watchdog import watchdog

print(watchdog().process.pid, flush=True)
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}, sys.argv[1]], stdout=subprocess.PIPE,
                         text=True)
child_pid = child.stdout.readline().strip()
time.sleep(1)  # the watchdog has listed the child
print(child_pid, flush=True)
time.sleep(120)
"""


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_process_a_child_starts_after_the_flow_was_killed_is_stopped(tmp_path):
    flow = subprocess.Popen(
        [sys.executable, "-c", FLOW, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    late_pid = None
    try:
        watchdog_pid = int(flow.stdout.readline())
        child_pid = int(flow.stdout.readline())
        flow.send_signal(signal.SIGKILL)
        flow.wait()
        assert wait_until(lambda: is_gone(watchdog_pid), timeout=15), "the watchdog never ended"
        late = tmp_path / "late.pid"
        assert late.exists(), "the child started nothing once stopped: the test tests nothing"
        late_pid = int(late.read_text())
        assert is_gone(child_pid)
        assert is_gone(late_pid), "the process started after the flow's death still runs"
    finally:
        for pid in (flow.pid, late_pid):
            if pid and not is_gone(pid):
                os.kill(pid, signal.SIGKILL)
