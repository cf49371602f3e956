"""A small process that cleans up after a flow process that was killed outright (SIGKILL, the
OOM killer), which can clean up nothing itself.

    python -m flywheel.watchdog PARENT_PID     # started by `Watchdog()`, never by hand

It keeps a list of the parent's descendants (vLLM's engine, trainers and their workers, Prefect's
temporary server), refreshed every half second, and reads JSON lines from the parent on stdin:
`{"open_run": [tracking_uri, run_id]}`, `{"closed_run": run_id}`, `{"temp_dir": path}`,
`{"flow_run": [api_url, flow_run_id]}`, and `{"exiting": true}` from the parent's exit handler.
The parent's death closes that pipe; then, unless the parent said it was exiting, it sets the
Prefect flow runs it was told of that are not over to Crashed (before it stops Prefect's
temporary server, which answers for them). Then it stops every descendant still running, marks
the open MLflow runs KILLED and removes the temporary folders. After a clean exit of the parent
there is normally nothing left to do.

Every process the parent starts after its watchdog carries `FLYWHEEL_WATCHED_BY` in its
environment (it inherits it, as do its own children): a process started after the last look,
or by a descendant once the parent was dead (out of the list's reach: its parent is init's), is
found by that mark and stopped too, round after round until none is left.

It runs in a session of its own, so a signal to the parent's process group does not reach it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import uuid

STOP_GRACE_S = 5.0  # SIGTERM first, SIGKILL for what is still there after this
# How often the parent's descendants are listed: a child it started less than this before its
# death is missed (its own children are not: see add_their_children).
SNAPSHOT_S = 0.5
WATCHED_BY = "FLYWHEEL_WATCHED_BY"  # in the environment of every process the parent starts
STOP_ROUNDS = 5  # a stopped process may start another as it goes; the next round stops that


class Watchdog:
    """The parent's side: start the watchdog, tell it what to clean up."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flywheel.watchdog", str(os.getpid()), watched_mark()],
            stdin=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self._lock = threading.Lock()
        atexit.register(self.tell, exiting=True)  # not run after a SIGKILL, which is the point

    def tell(self, **message) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):  # a dead watchdog: no help
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()


def watched_mark() -> str:
    """This process's mark, put into its environment for every process it starts from now on
    (a process started under another flow's watchdog gets its own)."""
    mark = os.environ.get(WATCHED_BY, "")
    if not mark.startswith(f"{os.getpid()}-"):
        mark = os.environ[WATCHED_BY] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return mark


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


def watch(parent_pid: int, mark: str) -> None:
    import psutil

    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:  # killed as we started: its messages and mark are still here
        parent = None
    known: dict[int, float] = {}  # descendant pid -> its start time (a reused pid is another)
    open_runs: dict[str, str] = {}  # MLflow run id -> tracking URI
    flow_runs: dict[str, str] = {}  # Prefect flow run id -> API URL
    temp_dirs: set[str] = set()
    exiting = False
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
            elif "flow_run" in message:
                api_url, flow_run_id = message["flow_run"]
                flow_runs[flow_run_id] = api_url
            elif "exiting" in message:
                exiting = True
        with contextlib.suppress(psutil.Error):
            for child in parent.children(recursive=True) if parent else ():
                known[child.pid] = child.create_time()
    add_their_children(known)
    if not exiting:  # a SIGKILL: Prefect's engine in the parent could not report its end
        crash_flow_runs(flow_runs)
    stop_leftovers(known, mark)
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


def stop_leftovers(known: dict[int, float], mark: str = "") -> None:
    """Stop the parent's descendants we know of and every process carrying its `mark`, in
    rounds: a process may start another while it is stopped (its exit handler, or a child that
    noticed the parent's death), which the next round finds by the mark."""
    for _ in range(STOP_ROUNDS):
        alive = still_running(known) + marked(mark)
        if not alive:
            return
        stop(alive)
        known = {}  # stopped; what is left carries the mark


def still_running(known: dict[int, float]) -> list:
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
    return alive


def marked(mark: str) -> list:
    """The running processes (of this user) whose environment carries `mark`, but this one."""
    import psutil

    found = []
    for process in psutil.process_iter() if mark else ():
        with contextlib.suppress(psutil.Error):
            if (
                process.pid != os.getpid()
                and process.status() != psutil.STATUS_ZOMBIE
                and process.environ().get(WATCHED_BY) == mark
            ):
                found.append(process)
    return found


def stop(alive: list) -> None:
    """SIGTERM, then SIGKILL for those still running after `STOP_GRACE_S`."""
    import psutil

    alive = list({process.pid: process for process in alive}.values())
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


def crash_flow_runs(flow_runs: dict[str, str]) -> None:
    """Set each flow run that is not over to Crashed, as Prefect's engine does for a flow it sees
    crash; a SIGKILLed flow's runs would show Running forever."""
    if not flow_runs:
        return
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.states import Crashed

    message = "the flow process was killed (SIGKILL or the OOM killer); marked by its watchdog"
    for flow_run_id, api_url in flow_runs.items():
        try:
            with SyncPrefectClient(api_url) as client:
                state = client.read_flow_run(flow_run_id).state
                if state is None or not state.is_final():
                    client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
        except Exception as error:  # the API may be gone too; nothing else to do
            print(f"flywheel watchdog: could not mark flow run {flow_run_id} Crashed: {error!r}")


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
    watch(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "")
