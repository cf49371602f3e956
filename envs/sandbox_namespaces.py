"""The namespace box's launcher: run as a script (`python -I -S -B sandbox_namespaces.py SPEC`) by
`envs.sandbox` (which imports it only for its constants). Standard library only; Linux only.

Three processes, so that the code never runs as a namespace's init (which the kernel shields
from its own SIGXCPU) and the parent still sees how the code ended:

- the launcher (this process, in the host's namespaces) reads the run's main.py, clones the
  mounts of the folders the box will show (open_tree: detached read-only copies), becomes the
  box's user (nobody when started as root: the kernel exempts real uid 0 from RLIMIT_NPROC),
  enters new user, mount, PID, network, IPC, UTS and cgroup namespaces, and waits;
- the box's init (PID 1 there) builds the box's root: a tmpfs holding those trees (the
  interpreter's files, read-only), a tmpfs of its own at /sandbox capped in bytes and files,
  five device nodes (null, zero, full, random, urandom) and a /proc of the new PID namespace;
  it pivots into it, drops every capability, installs a seccomp filter that refuses ptrace and
  process_vm_readv/writev, lowers its limits and makes itself non-dumpable (the code may
  neither trace it nor write its memory), then forks the worker and relays the worker's end to
  the launcher, which ends the same way;
- the worker (inheriting the filter and the limits, RLIMIT_NPROC included) closes every
  inherited descriptor, writes /sandbox/main.py, installs `sandbox_child`'s audit hooks as a
  second layer and runs it.

A step of the setup that the kernel refuses ends the launcher with SETUP_FAILED and a line on
stderr starting with SETUP_MARK, which `envs.sandbox` turns into an error naming the setting that
accepts the weaker box. When the launcher dies the box's init gets SIGKILL (PR_SET_PDEATHSIG),
and with it every process of the box's PID namespace.
"""

import atexit
import contextlib
import ctypes
import errno
import importlib.util
import json
import os
import resource
import signal
import sys
import traceback

SETUP_FAILED = 125
SETUP_MARK = "flywheel sandbox setup failed:"
BOX_HOME = "/sandbox"

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER = 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, MOVE_MOUNT_F_EMPTY_PATH = 1, 0o2000000, 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4
# The new mount API's system calls have one number on every architecture (Linux 5.2, 5.12).
OPEN_TREE, MOVE_MOUNT, MOUNT_SETATTR = 428, 429, 442
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_SET_SECCOMP = 38, 47, 22
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # glibc has no wrapper
# The seccomp filter's architectures (AUDIT_ARCH_*) and the calls it refuses there: ptrace,
# process_vm_readv, process_vm_writev.
SECCOMP_ARCH = {
    "x86_64": (0xC000003E, (101, 310, 311)),
    "aarch64": (0xC00000B7, (117, 270, 271)),
}
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 calls: a second number for each, refused whole
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
SECCOMP_DATA_NR, SECCOMP_DATA_ARCH = 0, 4  # offsets in struct seccomp_data
DEVICES = ("null", "zero", "full", "random", "urandom")
NOBODY = 65534

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


class MountAttributes(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("set", "clear", "propagation", "userns_fd")]


class SockFilter(ctypes.Structure):  # one classic-BPF instruction
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8)]
    _fields_ += [("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def check(result: int, step: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise SetupError(f"{step}: {os.strerror(error)} (errno {error})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    result = libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data))
    check(result, f"mount {source or ''} on {target}")


def write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


def load_child(path: str):
    """`sandbox_child` (the audit hooks and limits), loaded before the host's files disappear."""
    spec = importlib.util.spec_from_file_location("sandbox_child", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the launcher ------------------------------------------------------------------------------


def clone_tree(path: str) -> int:
    """A detached read-only copy of the mount at `path` (a descriptor), with no set-user-ID
    programs or device nodes."""
    tree = libc.syscall(OPEN_TREE, AT_FDCWD, path.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
    if tree < 0:
        check(tree, f"open_tree {path}")
    attributes = MountAttributes(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    size = ctypes.sizeof(attributes)
    result = libc.syscall(MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attributes), size)
    check(result, f"mount_setattr {path}")
    return tree


def clone_trees(spec: dict) -> dict[str, int]:
    """{path in the box: detached tree} for what the box shows of the host."""
    return {target: clone_tree(source) for target, source in spec["binds"].items()}


def enter_namespaces(box_uid: int) -> None:
    """Become `box_uid` (when root) and enter new namespaces in which it is mapped to itself."""
    if os.getuid() == 0 and box_uid != 0:
        os.setgroups([])
        os.setresgid(box_uid, box_uid, box_uid)
        os.setresuid(box_uid, box_uid, box_uid)
        # Changing user made this process undumpable, which leaves its /proc files root's.
        check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
    check(libc.unshare(flags | CLONE_NEWUTS | CLONE_NEWCGROUP), "unshare(user, mount, pid, net)")
    write("/proc/self/setgroups", "deny")
    write("/proc/self/uid_map", f"{uid} {uid} 1")
    write("/proc/self/gid_map", f"{gid} {gid} 1")


def relay(status: int) -> None:
    """End this process as the worker ended (its exit status, or the signal that killed it)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def main() -> None:
    spec = json.loads(sys.argv[1])
    child = load_child(spec["child"])
    # Read while the run's folder is reachable (as root, it is root's); the box's /sandbox is a
    # tmpfs of its own, so that no host folder is written and the quota holds.
    with open(os.path.join(spec["home"], "main.py"), "rb") as file:
        script = file.read()
    # SIGXCPU's default action dumps core: none from the launcher.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        # Root clones the trees before leaving its privileges (the box's user may not reach
        # them: a Python under /root); another user, in its own namespaces, where it may mount.
        trees = clone_trees(spec) if os.getuid() == 0 else None
        enter_namespaces(spec["box_uid"])
        trees = trees or clone_trees(spec)
    except (OSError, SetupError) as error:
        fail(error)
    report_read, report_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(report_read)
        box_init(spec, child, trees, script, report_write)
    os.close(report_write)
    for tree in trees.values():  # the box's init moved them into its mounts
        os.close(tree)
    _, status = os.waitpid(init, 0)
    with os.fdopen(report_read) as report:
        worker = report.read()
    relay(int(worker) if worker else status)


def fail(error: Exception) -> None:
    print(f"{SETUP_MARK} {error}", file=sys.stderr, flush=True)
    os._exit(SETUP_FAILED)


# ---- the box's init (PID 1) ---------------------------------------------------------------------


def box_init(spec: dict, child, trees: dict[str, int], script: bytes, report: int) -> None:
    try:
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        build_root(trees, spec["symlinks"])
        mount_home(spec["disk"])
        drop_capabilities()
        shield_init(spec, child)
    except (OSError, SetupError) as error:
        fail(error)
    worker = os.fork()
    if worker == 0:
        # Its own memory may be traced by nothing (the filter); its /proc files stay its own.
        check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
        run_worker(spec, child, script)
    os.write(report, str(reap_until(worker)).encode())
    os._exit(0)


def reap_until(worker: int) -> int:
    """Reap whatever ends in the box (orphans come to its init) until the worker does."""
    while True:
        pid, status = os.wait()
        if pid == worker:
            return status


def build_root(trees: dict[str, int], symlinks: dict[str, str]) -> None:
    root = "/tmp"  # a mount point every system has; the tmpfs over it is this namespace's own
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("box", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for target, tree in sorted(trees.items()):  # outer folders before those inside them
        os.makedirs(root + target, exist_ok=True)
        moved = libc.syscall(
            MOVE_MOUNT, tree, b"", AT_FDCWD, (root + target).encode(), MOVE_MOUNT_F_EMPTY_PATH
        )
        check(moved, f"move_mount {target}")
        os.close(tree)
    os.makedirs(root + BOX_HOME)
    for device in DEVICES:
        path = f"{root}/dev/{device}"
        make_mount_point(path, directory=False)
        mount(f"/dev/{device}", path, None, MS_BIND)
    for link, target in symlinks.items():
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        os.symlink(target, root + link)
    os.makedirs(root + "/proc")
    # Before the host's root goes: the kernel lets a namespace mount proc only while a full
    # proc is visible in it.
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(root)
    check(libc.syscall(PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "unmounting the host's root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # No namespaces inside the box: nested user namespaces would be a way back to capabilities.
    write("/proc/sys/user/max_user_namespaces", "0")
    check(libc.sethostname(b"sandbox", 7), "sethostname")


def mount_home(disk: dict) -> None:
    """/sandbox (its mount point made by build_root): a tmpfs of at most disk["mb"] MiB and
    disk["files"] inodes (itself and main.py included); nothing of it outlives the box."""
    limits = f"size={disk['mb']}m,nr_inodes={disk['files']},mode=0700"
    mount("sandbox", BOX_HOME, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, limits)


def shield_init(spec: dict, child) -> None:
    """Keep the code off the box's init, which runs without the hooks: no tracing it (it is
    not dumpable, and the filter the worker inherits refuses ptrace and process_vm_*), and the
    worker's limits on it too, in case it is reached all the same."""
    deny_tracing()
    # The launcher, the box's init and the worker count against RLIMIT_NPROC too.
    child.set_limits(spec["limits"], processes=3 + spec["limits"]["max_processes"])
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")


def deny_tracing() -> None:
    """A seccomp filter on this process and its children: ptrace, process_vm_readv and
    process_vm_writev fail with EPERM, and so does every call made through another
    architecture's numbers (x86_64's 32-bit and x32 entry points)."""
    machine = os.uname().machine
    if machine not in SECCOMP_ARCH:
        raise SetupError(f"no seccomp filter for this architecture ({machine})")
    instructions = [SockFilter(*step) for step in tracing_filter(*SECCOMP_ARCH[machine])]
    program = (SockFilter * len(instructions))(*instructions)
    fprog = SockFprog(len(instructions), ctypes.cast(program, ctypes.POINTER(SockFilter)))
    result = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
    check(result, "prctl(SECCOMP)")


def tracing_filter(arch: int, denied: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """The classic-BPF program: (code, jump if true, jump if false, k) instructions."""
    deny = (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)
    count = len(denied)
    return [
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        (BPF_JEQ_K, 1, 0, arch),  # this architecture: on to the call's number
        deny,
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        (BPF_JGE_K, count + 1, 0, X32_SYSCALL_BIT),  # to the final deny
        *[(BPF_JEQ_K, count - i, 0, number) for i, number in enumerate(denied)],
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        deny,
    ]


def make_mount_point(path: str, directory: bool) -> None:
    os.makedirs(path if directory else os.path.dirname(path), exist_ok=True)
    if not directory and not os.path.exists(path):
        open(path, "w").close()


def drop_capabilities() -> None:
    """No capability left in the box's user namespace, none to be had again."""
    with open("/proc/sys/kernel/cap_last_cap") as file:
        last = int(file.read())
    for capability in range(last + 1):
        check(libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0), "dropping the bounding set")
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient caps")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    check(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


# ---- the worker ------------------------------------------------------------------------------


def run_worker(spec: dict, child, script: bytes) -> None:
    """Run the code as a script would run; never returns."""
    status = 1
    try:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(BOX_HOME)
        # Written here, under the limits and the quota: code too large for them is the run's
        # error (its traceback), not the box's.
        with open("main.py", "wb") as file:
            file.write(script)
        sys.path.extend(spec["site_packages"])
        status = child.run_script(BOX_HOME)
    except SystemExit as exit:
        status = script_exit_status(exit)
    except BaseException:
        traceback.print_exc()
    finally:
        finish_script()
    os._exit(status)


def finish_script() -> None:
    """What the interpreter does at a script's end: join its threads, run its atexit functions,
    flush its output."""
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    flush()


def script_exit_status(exit: SystemExit) -> int:
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)
    return 1


def flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a full disk, a closed stream: nothing more to say
            stream.flush()


if __name__ == "__main__":
    main()
