"""The sandboxed interpreter's first steps: run as a script (`python -I -B sandbox_child.py DIR
LIMITS`) by `envs.sandbox` in the audit-hook box, and loaded by the namespace box's launcher
(`envs/sandbox_namespaces.py`), whose worker calls `set_limits` and `run_script` the same way.
Standard library only, since it runs isolated.

It lowers its own resource limits, then installs an audit hook that refuses what model-written
code has no business doing (network, processes, writing outside DIR, signals to others), then runs
DIR/main.py as `__main__`. A refusal raises PermissionError, so the code sees an ordinary error and
its traceback's last line tells the agent what was refused. On its own (the audit-hook box) this
guards against mistakes, not against code that sets out to escape; in the namespace box it is
the second layer (see `envs.sandbox`).
"""

import json
import os
import resource
import signal
import sys

MIB = 1024 * 1024
NETWORK = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"}
PROCESSES = {
    "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
    "subprocess.Popen", "pty.spawn",
}  # fmt: skip
SIGNALS = {"os.kill", "os.killpg"}
# Events whose path arguments are written, removed or changed on disk (shutil's copies and moves
# come down to the "open", os.chmod and os.rename checks).
FILE_CHANGES = {
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
    "os.symlink", "os.truncate", "os.utime", "os.mkfifo", "os.mknod", "shutil.rmtree",
}  # fmt: skip
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def own_task_count() -> int:
    """Processes and threads of this user now: RLIMIT_NPROC counts all of them."""
    uid, count = str(os.getuid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:  # the process ended meanwhile
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            count += int(fields.get("Threads", "1"))
    return count


def limit(kind: int, value: int) -> None:
    resource.setrlimit(kind, (value, value))


def set_limits(limits: dict, processes: int | None = None) -> None:
    """`processes`: RLIMIT_NPROC, which counts the user's processes and threads (None: those
    running now plus `max_processes`)."""
    limit(resource.RLIMIT_AS, limits["memory_mb"] * MIB)
    # The soft CPU limit sends SIGXCPU (which kills); the hard one a second later SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    limit(resource.RLIMIT_FSIZE, limits["max_file_mb"] * MIB)
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_NOFILE, limits["max_open_files"])
    # The kernel does not enforce it for real uid 0; the audit hook is the guard there (and the
    # namespace box runs the code as another user for this reason).
    if os.getuid() != 0:
        limit(resource.RLIMIT_NPROC, processes or own_task_count() + limits["max_processes"])
    # An oversized write fails with an OSError the code can see, instead of killing it silently.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def inside(path, home: str) -> bool:
    if isinstance(path, int):  # an open descriptor: opening it was checked already
        return True
    real = os.path.realpath(os.fsdecode(path))
    return real == home or real.startswith(home + os.sep)


def _writes(flags) -> bool:
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def refuse(what: str, event: str):
    raise PermissionError(f"sandbox: {what} is not allowed here ({event})")


def guard(home: str):
    def hook(event: str, args: tuple) -> None:
        if event in NETWORK:
            refuse("network access", event)
        if event in PROCESSES:
            refuse("starting processes", event)
        if event in SIGNALS and args[0] not in (0, os.getpid()):
            refuse("signalling other processes", event)
        if event == "open" and _writes(args[2]) and not inside(args[0], home):
            refuse(f"writing outside {home}", event)
        if event in FILE_CHANGES:
            paths = [a for a in args if isinstance(a, str | bytes | os.PathLike)]
            if not all(inside(p, home) for p in paths):
                refuse(f"changing files outside {home}", event)

    return hook


def run_script(home: str) -> int:
    """Run HOME/main.py as `__main__` behind the audit hook; its exceptions propagate."""
    with open(os.path.join(home, "main.py")) as file:
        source = file.read()
    code = compile(source, "main.py", "exec")
    sys.argv = ["main.py"]
    sys.addaudithook(guard(home))
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    return 0


def main() -> None:
    home, limits = os.path.realpath(sys.argv[1]), json.loads(sys.argv[2])
    set_limits(limits)
    run_script(home)


if __name__ == "__main__":
    main()
