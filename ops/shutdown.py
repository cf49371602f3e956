"""How a flow process stops without leaving anything behind.

Told to stop (SIGTERM from a person, a Prefect worker or Kubernetes; Ctrl-C): Prefect turns the
signal into an exception in the main thread, and on its way out the recipe's stage flow stops
every trainer's process group and shuts vLLM's engine down (`stop_children`), so stages running in
other threads end in seconds instead of running to completion (from then on no stage starts an
engine or a trainer, and an engine still loading is killed: `flywheel/stopping.py`); the MLflow runs end KILLED; the
process exits normally, so Prefect's temporary server is stopped by its own exit handler. That
server runs in a session of its own (`keep_temporary_server_apart`): a signal to the flow's whole
process group (Ctrl-C in a terminal, `kill -- -PGID`) does not stop it under the flow, whose crash
handler still has to report the run's state to it.

Killed outright (SIGKILL): nothing runs in the process any more; its watchdog
(`flywheel/watchdog.py`) stops what it left and marks its runs KILLED.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import tempfile
from contextlib import contextmanager, suppress


def stop_children(reason: str = "the run was stopped") -> None:
    """Stop what this process started that would outlive a stopped flow: trainers, vLLM; and
    have every stage refuse to start more (`flywheel.stopping`), an engine still loading
    included (`release_vllm` kills it rather than wait for it)."""
    from flywheel.inference import release_vllm
    from flywheel.stopping import stop_run
    from training.launch import stop_trainers

    stop_run(reason)  # first: a launch racing this either sees it or is in stop_trainers' list
    stop_trainers()
    release_vllm()  # a generate call in another thread fails now, which ends its stage


@contextmanager
def stopping_children_on_error():
    """Stop trainers and vLLM when the block is left by an exception (a signal included). The
    block starts unstopped: an earlier run's stop in this process does not stop it."""
    from flywheel.stopping import reason_for, resume_runs

    resume_runs()
    try:
        yield
    except BaseException as error:
        stop_children(reason_for(error))
        raise


def exit_on_sigterm(signum, frame):
    # SystemExit, unlike the default action, runs exit handlers: Prefect's temporary server is
    # stopped by one. Prefect calls this after its own handling of the signal.
    raise SystemExit(128 + signum)


@contextmanager
def flow_process():
    """For a process that runs one flow from the command line: SIGTERM exits cleanly, every
    temporary file goes under one folder of the process's own (removed on the way out, or by the
    watchdog after a SIGKILL), and the watchdog runs."""
    from flywheel.watchdog import watchdog

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    become_subreaper()
    keep_temporary_server_apart()
    # Short: vLLM puts its ZeroMQ sockets here, and a socket's path may not exceed 107 bytes.
    temp_root = tempfile.mkdtemp(prefix="fw-")
    previous_tempdir, previous_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = temp_root  # trainers and vLLM's engine inherit it
    watchdog().tell(temp_dir=temp_root)
    try:
        with stopping_children_on_error():
            yield
    finally:
        # A clean exit too closes the engine the way `release_vllm` does (its processes looked
        # up, shut down, waited for, killed): left to the exit handlers, a loaded machine's
        # `VLLM::Worker` outlived the flow and its watchdog stopped it (the chaos bench).
        from flywheel.inference import release_vllm

        with suppress(Exception):  # a failed shutdown must not skip the cleanup below, whose
            release_vllm()  # sweep stops whatever the engine left
        signal.signal(signal.SIGTERM, previous)
        tempfile.tempdir = previous_tempdir
        if previous_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous_env
        shutil.rmtree(temp_root, ignore_errors=True)
        stop_orphaned_engine_processes()
        stop_resource_tracker()


def keep_temporary_server_apart() -> None:
    """Without a Prefect server (`PREFECT_API_URL` unset), Prefect starts a temporary one on
    first use: have it start in a session of its own. In the flow's process group, a signal to
    the group stopped it with the flow; the flow's crash handler then retried reporting the
    run's state to it (Prefect's client backs off 2, 4, ..., 32 s a request): the flow exited 1
    to 6 minutes late and its run stayed Running. It is still the flow's child: its exit handler
    stops it, and the watchdog after a SIGKILL."""
    if not prefect_uses_temporary_server():
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the process's one, which Prefect's client starts
    if not server.running:
        server._run_uvicorn_command = in_own_session(server._run_uvicorn_command)


def prefect_uses_temporary_server() -> bool:
    """True when no Prefect API is configured (`PREFECT_API_URL` unset, in Prefect's settings or
    this process's environment) and Prefect may start its temporary server on first use."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url or os.environ.get("PREFECT_API_URL"):
        return False
    return bool(settings.server.ephemeral.enabled)


def in_own_session(start_process):
    """`start_process()`, with the processes it starts via `subprocess.Popen` in a new session.
    Prefect's server has no option for it; Popen is replaced only for the call, which Prefect
    makes as the flow run begins, before any stage's thread starts a process."""

    @functools.wraps(start_process)
    def started_apart():
        popen = subprocess.Popen
        subprocess.Popen = functools.partial(popen, start_new_session=True)
        try:
            return start_process()
        finally:
            subprocess.Popen = popen

    return started_apart


def become_subreaper() -> None:
    """Linux: processes orphaned below this one become its children rather than init's, so the
    flow can still stop them. vLLM's engine starts its worker; an engine killed (SIGKILL, the OOM
    killer) while the worker starts leaves that worker orphaned, and a failed run left it for the
    watchdog (the chaos bench's vLLM kills)."""
    import ctypes
    import sys

    if sys.platform != "linux":
        return
    PR_SET_CHILD_SUBREAPER = 36
    with suppress(OSError, AttributeError):  # without it, the watchdog stops what is left
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


ENGINE_STOP_S = 5.0  # SIGTERM, then SIGKILL after this long


def stop_orphaned_engine_processes() -> None:
    """On the way out, after the flow ended: stop the children of this process that are vLLM's
    or multiprocessing's (a worker orphaned by its killed engine, adopted as a subreaper), so
    that nothing is left for the watchdog. Prefect's server, the watchdog and the resource
    tracker have ways out of their own."""
    import psutil

    me = psutil.Process()
    left = []
    # Recursive: an engine core's worker is its child, not ours, until the core ends.
    for child in me.children(recursive=True):
        try:
            described = f"{child.name()} {' '.join(child.cmdline())}"
        except psutil.Error:
            continue
        if "VLLM::" in described or "multiprocessing.spawn import spawn_main" in described:
            left.append(child)
    for child in left:
        with suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(left, timeout=ENGINE_STOP_S)
    for child in alive:
        with suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=ENGINE_STOP_S)  # reaped: no zombie for the watchdog


# How long a clean exit waits for multiprocessing's resource tracker to end.
RESOURCE_TRACKER_STOP_S = 5.0


def stop_resource_tracker() -> None:
    """End multiprocessing's resource tracker (a process started by vLLM and torch for their
    semaphores) now, on the way out. Left alone it ends only when this process has exited and
    closed its pipe, a moment too late: the watchdog then finds it running and stops it, and
    every clean run ended with "flywheel watchdog: stopped 1 processes the flow left". Stopping
    it here lets it unlink what it tracks and end first. In a thread with a time limit: a
    process still holding the tracker's pipe (a child that outlived the flow) would keep it,
    and the wait for it, alive; the watchdog stops both then."""
    import threading
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker  # the process's own; no public handle exists
    if tracker._fd is None:  # never started, or already stopped
        return
    stopping = threading.Thread(target=tracker._stop, daemon=True)
    stopping.start()
    stopping.join(RESOURCE_TRACKER_STOP_S)
