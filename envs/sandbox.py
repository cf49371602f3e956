"""Run model-written Python in a subprocess with limits (the `python` tool's engine).

Each run gets a fresh temporary directory (its working directory, HOME and TMPDIR), removed
afterwards, and a new session, so that on a timeout the whole process group is killed. The child
(`envs/sandbox_child.py`) lowers its limits and installs an audit hook before the code runs:

- wall time: the parent kills the group after `wall_s`; CPU time: RLIMIT_CPU (SIGXCPU);
- memory: RLIMIT_AS (an allocation past it raises MemoryError); file size: RLIMIT_FSIZE, which
  also bounds what the code can print (stdout goes to a file);
- processes: the audit hook refuses fork, exec, spawn, subprocess and os.system; RLIMIT_NPROC
  (the user's current count plus `max_processes`) backs it up for non-root users;
- network: the hook refuses socket connect, bind, sendto, sendmsg and name lookups;
- files: the hook refuses opening for writing, removing, renaming or changing any path outside
  the run's own directory (symlinks are resolved first);
- signals: the hook refuses signalling any process but itself.

Threat model, honestly: this is a guard against a model's mistakes (an infinite loop, a
runaway allocation, a stray `rm`, a fork in a loop, a request to the internet), not a security
boundary against code that sets out to escape. Audit hooks can be bypassed (ctypes calling libc
directly, `_posixsubprocess`, file calls relative to a `dir_fd` opened outside); the code can read whatever the parent's user can read; as root,
RLIMIT_NPROC does not apply, so a fork made through ctypes is bounded only by the timeout's
group kill. Untrusted code needs a container or VM (gVisor, firecracker) instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int | None = None  # None: the wall time, rounded up, plus one second
    memory_mb: int = 1024
    max_processes: int = 16
    max_file_mb: int = 8  # any file written, stdout included
    root: str | None = None  # where the runs' temporary directories go (None: the system's)

    def child_limits(self) -> dict:
        cpu_s = self.cpu_s if self.cpu_s is not None else math.ceil(self.wall_s) + 1
        return {
            "cpu_s": cpu_s,
            "memory_mb": self.memory_mb,
            "max_processes": self.max_processes,
            "max_file_mb": self.max_file_mb,
        }


@dataclass(frozen=True)
class SandboxRun:
    stdout: str
    error: str | None  # the traceback's last line, or why the run was stopped
    seconds: float


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxRun:
    """Run `code` as a script in a fresh sandbox; never raises for anything the code does."""
    home = tempfile.mkdtemp(prefix="flywheel-python-", dir=limits.root)
    started = time.perf_counter()
    try:
        Path(home, "main.py").write_text(code)
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            returncode, stopped = _run_child(home, limits, stdout, stderr)
            output, error = _read(stdout), stopped or _failure(returncode, _read(stderr))
        return SandboxRun(output, error, time.perf_counter() - started)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _run_child(home: str, limits: SandboxLimits, stdout, stderr) -> tuple[int, str | None]:
    """Run the child to its end or its wall time: its exit status, and why it was stopped."""
    command = [sys.executable, "-I", "-B", str(CHILD), home, json.dumps(limits.child_limits())]
    child = subprocess.Popen(
        command,
        cwd=home,
        env=_child_env(home),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,  # its own process group, killed whole below
    )
    try:
        child.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        return -signal.SIGKILL, f"timed out after {limits.wall_s:g} s (wall-time limit)"
    finally:  # on a timeout the code; otherwise anything it left running in its group
        _kill_group(child)
    return child.returncode, None


def _kill_group(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _child_env(home: str) -> dict[str, str]:
    # One BLAS thread: numpy's thread pools would otherwise reserve memory against RLIMIT_AS.
    threads = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return {"PATH": os.defpath, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", **threads}


def _failure(returncode: int, stderr: str) -> str | None:
    """Why the code failed: the traceback's last line, the signal that killed it, or its exit
    status; None when it succeeded (whatever it wrote to stderr then, warnings say)."""
    if returncode == 0:
        return None
    if returncode < 0:
        if -returncode == signal.SIGXCPU:
            return "killed: CPU-time limit reached"
        return f"killed by {signal.Signals(-returncode).name}"
    return _last_line(stderr) or f"exited with status {returncode}"


def _read(file) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="replace")


def _last_line(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else None
