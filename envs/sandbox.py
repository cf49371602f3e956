"""Run model-written Python in a subprocess with limits (the `python` tool's engine).

Each run gets a fresh temporary directory (its working directory, HOME and TMPDIR), removed
afterwards, and a new session, so that on a timeout the whole process group is killed. Two boxes,
chosen by `SandboxLimits.isolation` (the setting `env.qa.python_isolation`):

"namespaces" (the default; `envs/sandbox_namespaces.py`): the code runs in new user, mount, PID,
network, IPC, UTS and cgroup namespaces, as an unprivileged user with no capabilities. It sees a
root of its own: read-only binds of the interpreter's files (its prefix, the virtual environment,
/usr/lib), a tmpfs at /sandbox (main.py, capped at `disk_mb` and `max_files`), /dev/null and
friends, and a /proc showing only its own processes; nothing else of the host (no /etc, no home,
no /tmp, not the run's folder). The network namespace
has only a loopback that is down, so no connection leaves, whatever the code calls. Its
environment is a fixed one of a few variables, nothing of the parent's. RLIMIT_NPROC holds
(the box's user is not root), and nested user namespaces are disabled inside. The box's init
is shielded from the code: not dumpable, under the same limits, and a seccomp filter refuses
ptrace and process_vm_readv/writev to everything in the box. Where the kernel
refuses a step of this, `run_python` raises SandboxUnavailable naming the setting that accepts
the weaker box; nothing falls back silently.

"audit-hooks": the code runs with the parent's user and view, behind the child's audit hooks
only. That box is a guard against a model's mistakes, not against code that sets out to escape:
ctypes reaches libc past the hooks, files relative to a `dir_fd` opened outside are not checked,
anything the parent's user can read is readable, and as root RLIMIT_NPROC does not apply.

In both, `envs/sandbox_child.py` lowers the limits and installs the audit hooks before the code
runs (in the namespace box, as a second layer):

- wall time: the parent kills the group after `wall_s`; CPU time: RLIMIT_CPU (SIGXCPU);
- memory: RLIMIT_AS (an allocation past it raises MemoryError); file size: RLIMIT_FSIZE, which
  also bounds what the code can print (stdout goes to a file); open files: RLIMIT_NOFILE;
- processes: the audit hook refuses fork, exec, spawn, subprocess and os.system; RLIMIT_NPROC
  (`max_processes` more) backs it up for non-root users, the namespace box's included;
- network: the hook refuses socket connect, bind, sendto, sendmsg and name lookups;
- files: the hook refuses opening for writing, removing, renaming or changing any path outside
  the run's own directory (symlinks are resolved first);
- signals: the hook refuses signalling any process but itself.

What the namespace box does not do (see docs/sandbox.md): it shares the host's kernel, so a
kernel bug is a way out (gVisor or a VM close that); its seccomp filter refuses three calls,
not the kernel's whole surface; and memory is bounded per process (RLIMIT_AS), not for the
box as a whole (no cgroup).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from envs.sandbox_namespaces import BOX_HOME, NOBODY, SETUP_FAILED, SETUP_MARK

CHILD = Path(__file__).with_name("sandbox_child.py")
LAUNCHER = Path(__file__).with_name("sandbox_namespaces.py")
Isolation = Literal["namespaces", "audit-hooks"]
WEAKER_BOX_SETTING = "env.qa.python_isolation=audit-hooks"
# Library folders the interpreter's extension modules load from (libffi for ctypes, libssl, ...).
SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32")


class SandboxUnavailable(RuntimeError):
    """The kernel refused the namespace box; the message names the setting for the weaker one."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int | None = None  # None: the wall time, rounded up, plus one second
    memory_mb: int = 1024
    max_processes: int = 16
    max_file_mb: int = 8  # any file written, stdout included
    max_open_files: int = 256
    # The namespace box's /sandbox, a tmpfs: its bytes and its files (folders, main.py and the
    # folder itself included). The audit-hook box writes to the host's disk without a quota.
    disk_mb: int = 64
    max_files: int = 4096
    root: str | None = None  # where the runs' temporary directories go (None: the system's)
    isolation: Isolation = "namespaces"

    def __post_init__(self) -> None:
        if self.disk_mb < 1 or self.max_files < 2:
            raise ValueError(
                f"SandboxLimits: disk_mb={self.disk_mb} and max_files={self.max_files} leave no "
                "room for main.py in /sandbox; set disk_mb >= 1 and max_files >= 2 (the folder "
                "and main.py each take a file)"
            )

    def child_limits(self) -> dict:
        cpu_s = self.cpu_s if self.cpu_s is not None else math.ceil(self.wall_s) + 1
        return {
            "cpu_s": cpu_s,
            "memory_mb": self.memory_mb,
            "max_processes": self.max_processes,
            "max_file_mb": self.max_file_mb,
            "max_open_files": self.max_open_files,
        }


@dataclass(frozen=True)
class SandboxRun:
    stdout: str
    error: str | None  # the traceback's last line, or why the run was stopped
    seconds: float


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxRun:
    """Run `code` as a script in a fresh sandbox; never raises for anything the code does.
    Raises SandboxUnavailable where the kernel refuses the namespace box."""
    home = tempfile.mkdtemp(prefix="flywheel-python-", dir=limits.root)
    started = time.perf_counter()
    try:
        Path(home, "main.py").write_text(code)
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            returncode, stopped = _run_child(home, limits, stdout, stderr)
            output, errors = _read(stdout), _read(stderr)
            if returncode == SETUP_FAILED and errors.startswith(SETUP_MARK):
                raise SandboxUnavailable(_refusal(errors))
            error = stopped or _failure(returncode, errors)
        return SandboxRun(output, error, time.perf_counter() - started)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _refusal(errors: str) -> str:
    return (
        f"the python tool's namespace box could not start ({errors.splitlines()[0]}). The "
        "kernel must allow unprivileged user namespaces (sysctls user.max_user_namespaces > 0, "
        "kernel.unprivileged_userns_clone=1, kernel.apparmor_restrict_unprivileged_userns=0 "
        f"where they exist). To run model-written code behind audit hooks only, a box it can "
        f"walk out of (docs/sandbox.md), set {WEAKER_BOX_SETTING}"
    )


@functools.cache
def check_namespaces() -> None:
    """Raise SandboxUnavailable unless the namespace box runs here (tried once per process)."""
    run = run_python("print('ok')", SandboxLimits(wall_s=30))
    if run.stdout != "ok\n":
        raise SandboxUnavailable(
            f"the python tool's namespace box did not run a test script ({run.error}); to run "
            f"model-written code behind audit hooks only, set {WEAKER_BOX_SETTING}"
        )


def _run_child(home: str, limits: SandboxLimits, stdout, stderr) -> tuple[int, str | None]:
    """Run the child to its end or its wall time: its exit status, and why it was stopped."""
    if limits.isolation == "namespaces":
        command, env = _box_command(home, limits), _child_env(BOX_HOME)
    else:
        command = [sys.executable, "-I", "-B", str(CHILD), home, json.dumps(limits.child_limits())]
        env = _child_env(home)
    child = subprocess.Popen(
        command,
        cwd=home,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,  # its own process group, killed whole below
    )
    try:
        child.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        # The killed processes the launcher started are no longer its to reap: wait until the
        # kernel has ended them, so that a timed-out run too leaves nothing behind.
        _await_group_end(child.pid)
        return -signal.SIGKILL, f"timed out after {limits.wall_s:g} s (wall-time limit)"
    _kill_group(child)  # anything the code left running in its group
    return child.returncode, None


def _box_command(home: str, limits: SandboxLimits) -> list[str]:
    """The launcher's command line: what the box shows, and as whom the code runs."""
    binds, symlinks = interpreter_view()
    spec = {
        "child": str(CHILD),
        "home": home,  # where the launcher reads main.py; the box's /sandbox is a tmpfs
        "disk": {"mb": limits.disk_mb, "files": limits.max_files},
        "binds": binds,
        "symlinks": symlinks,
        "site_packages": [p for p in site.getsitepackages() if os.path.isdir(p)],
        "box_uid": _box_user(),
        "limits": limits.child_limits(),
    }
    return [sys.executable, "-I", "-S", "-B", str(LAUNCHER), json.dumps(spec)]


@functools.cache
def _box_user() -> int:
    """Whom the code runs as: nobody for root (the kernel exempts uid 0 from RLIMIT_NPROC),
    where nobody exists in this user namespace; otherwise this process's own user."""
    if os.getuid() != 0:
        return os.getuid()
    with open("/proc/self/uid_map") as uid_map:
        ranges = [[int(n) for n in line.split()] for line in uid_map]
    mapped = any(inside <= NOBODY < inside + count for inside, _, count in ranges)
    return NOBODY if mapped else 0


@functools.cache
def interpreter_view() -> tuple[dict[str, str], dict[str, str]]:
    """What the box shows of the host, read-only: {path in the box: folder on the host} for the
    interpreter's prefixes and the system's library folders (outermost only), and
    {path: symlink target} for those that are links (/lib -> usr/lib on a merged /usr)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    binds, symlinks = {}, {}
    for path in sorted(prefixes | set(SYSTEM_LIBRARIES), key=len):
        if os.path.islink(path) and os.path.dirname(path) == "/":
            symlinks[path] = os.readlink(path)
        elif os.path.isdir(path) and not any(_within(path, outer) for outer in binds):
            binds[path] = os.path.realpath(path)
    return binds, symlinks


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _kill_group(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _await_group_end(group: int, deadline_s: float = 5.0) -> None:
    """Return once no process of `group` is alive (zombies aside), or after `deadline_s`."""
    ends = time.monotonic() + deadline_s
    while _live_members(group) and time.monotonic() < ends:
        time.sleep(0.005)


def _live_members(group: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (command)"
        except (OSError, IndexError):  # ended meanwhile
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):  # state, ppid, pgrp
            members.append(int(stat.parent.name))
    return members


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
