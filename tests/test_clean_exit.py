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
