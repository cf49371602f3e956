"""A small process that cleans up after a flow process that was killed outright (SIGKILL, the
OOM killer), which can clean up nothing itself.

    python -m flywheel.watchdog PARENT_PID     # started by `Watchdog()`, never by hand

It keeps a list of the parent's descendants (vLLM's engine, trainers and their workers, Prefect's
temporary server), refreshed every second, and reads JSON lines from the parent on stdin:
`{"open_run": [tracking_uri, run_id]}`, `{"closed_run": run_id}`, `{"temp_dir": path}`. The
parent's death closes that pipe; then it stops every descendant still running, marks the open
MLflow runs KILLED and removes the temporary folders. After a clean exit of the parent it does
the same, and there is normally nothing left to do.

It runs in a session of its own, so a signal to the parent's process group does not reach it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading

STOP_GRACE_S = 5.0  # SIGTERM first, SIGKILL for what is still there after this
# How often the parent's descendants are listed: a child it started less than this before its
# death is missed (its own children are not: see add_their_children).
SNAPSHOT_S = 0.5


class Watchdog:
    """The parent's side: start the watchdog, tell it what to clean up."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flywheel.watchdog", str(os.getpid())],
            stdin=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self._lock = threading.Lock()

    def tell(self, **message) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):  # a dead watchdog: no help
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()


_watchdog: Watchdog | None = None
_watchdog_lock = threading.Lock()


def watchdog() -> Watchdog:
    """This process's watchdog, started on first use; it lives as long as the process."""
    global _watchdog
    with _watchdog_lock:
        if _watchdog is None or _watchdog.process.poll() is not None:
            _watchdog = Watchdog()
        return _watchdog


# The watchdog process ------------------------------------------------------------------------


def watch(parent_pid: int) -> None:
    import psutil

    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return
    known: dict[int, float] = {}  # descendant pid -> its start time (a reused pid is another)
    open_runs: dict[str, str] = {}  # MLflow run id -> tracking URI
    temp_dirs: set[str] = set()
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], SNAPSHOT_S)
        if ready:
            line = sys.stdin.readline()
            if not line:  # the parent is gone (or done): its end of the pipe closed
                break
            message = json.loads(line)
            if "open_run" in message:
                uri, run_id = message["open_run"]
                open_runs[run_id] = uri
            elif "closed_run" in message:
                open_runs.pop(message["closed_run"], None)
            elif "temp_dir" in message:
                temp_dirs.add(message["temp_dir"])
        with contextlib.suppress(psutil.Error):
            for child in parent.children(recursive=True):
                known[child.pid] = child.create_time()
    add_their_children(known)
    stop_leftovers(known)
    kill_open_runs(open_runs)
    for folder in temp_dirs:
        shutil.rmtree(folder, ignore_errors=True)


def add_their_children(known: dict[int, float]) -> None:
    """Processes started since the last look by processes we know of (vLLM's engine starts its
    workers late); the parent's own newest children went to init with its death, out of reach."""
    import psutil

    for pid, started in list(known.items()):
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if abs(process.create_time() - started) < 1.0:
                for child in process.children(recursive=True):
                    known[child.pid] = child.create_time()


def stop_leftovers(known: dict[int, float]) -> None:
    import psutil

    alive = []
    for pid, started in known.items():
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            # a zombie is dead already (init reaps it once its parent is gone): nothing to stop
            if (
                abs(process.create_time() - started) < 1.0
                and process.pid != os.getpid()
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                alive.append(process)
    names = [described(process) for process in alive]  # before they are gone
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGTERM)
    _, still_running = psutil.wait_procs(alive, timeout=STOP_GRACE_S)
    for process in still_running:
        with contextlib.suppress(psutil.Error):
            process.kill()
    if alive:
        print(
            f"flywheel watchdog: stopped {len(alive)} processes the flow left: " + "; ".join(names),
            file=sys.stderr,
        )


def described(process) -> str:
    """`pid name cmdline` (shortened), or the pid alone once it is gone."""
    import psutil

    try:
        return f"{process.pid} {process.name()} {' '.join(process.cmdline())[:120]}"
    except psutil.Error:
        return str(process.pid)


def kill_open_runs(open_runs: dict[str, str]) -> None:
    if not open_runs:
        return
    from flywheel.tracking import kill_run

    for run_id, uri in open_runs.items():
        try:
            kill_run(uri, run_id)
        except Exception as error:  # the store may be gone too; nothing else to do
            print(f"flywheel watchdog: could not mark run {run_id} KILLED: {error!r}")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for the flow is not for us
    watch(int(sys.argv[1]))
