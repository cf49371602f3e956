"""Escapes from the python tool's sandbox, each written as model code would write it and run in
both boxes: it must succeed in the audit-hook box (so the test can see an escape at all) and fail
in the namespace box. Then what only the namespace box promises (its user, its view, its limits),
and the kernel's refusal of namespaces, which must name the setting for the weaker box."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import running_command_lines

from envs.sandbox import SandboxLimits, SandboxRun, interpreter_view, run_python
from envs.tools import PythonTool

ROOT = Path(__file__).resolve().parent.parent
BOXES = ["audit-hooks", "namespaces"]
AS_ROOT = os.getuid() == 0
# Ctypes reaches libc past the audit hooks, as an escaping script would.
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def with_libc(code: str) -> str:
    return LIBC + textwrap.dedent(code)


def box(isolation: str, code: str, **limits) -> SandboxRun:
    return run_python(textwrap.dedent(code), SandboxLimits(isolation=isolation, **limits))


def expect_escape(isolation: str, escaped: bool, run: SandboxRun) -> None:
    """The escape worked in the weak box and did not in the namespace box."""
    assert escaped == (isolation == "audit-hooks"), run


@pytest.fixture
def host(tmp_path):
    """A folder of the host, outside any run's folder, with a secret file in it."""
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "secret.txt").write_text("the host's secret")
    return folder


# ---- reading the host ------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", BOXES)
@pytest.mark.parametrize("path", ["/etc/passwd", "/etc/shadow"])
def test_reading_the_hosts_files(isolation, path):
    if not os.access(path, os.R_OK):
        pytest.skip(f"{path} is not readable by this user, in or out of a box")
    run = box(isolation, f"print(open({path!r}).read(), end='')")
    expect_escape(isolation, run.stdout == Path(path).read_text() != "", run)


@pytest.mark.parametrize("isolation", BOXES)
def test_listing_the_users_home(isolation):
    home = Path.home()
    run = box(isolation, f"import os\nprint(sorted(os.listdir({str(home)!r})))")
    expect_escape(isolation, run.stdout == f"{sorted(os.listdir(home))}\n", run)


@pytest.mark.parametrize("isolation", BOXES)
def test_reading_the_parents_environment_through_proc(isolation):
    """The flow holds credentials in its environment; the tool's parent here is a process
    started with a fake AWS secret in it. The code looks for it in every /proc/PID/environ."""
    secret = "AKIAFAKESECRET0123456789"
    code = """
        import os
        for pid in [os.getppid()] + [p for p in os.listdir('/proc') if p.isdigit()]:
            try:
                print(open(f'/proc/{pid}/environ', 'rb').read())
            except OSError:
                pass
    """
    parent = (
        "import sys\nfrom envs.sandbox import SandboxLimits, run_python\n"
        f"print(run_python(sys.stdin.read(), SandboxLimits(isolation={isolation!r})).stdout)"
    )
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": secret}
    done = subprocess.run(
        [sys.executable, "-c", parent],
        input=textwrap.dedent(code),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    expect_escape(isolation, secret in done.stdout, done)


@pytest.mark.parametrize("isolation", BOXES)
def test_proc_self_and_pid_1_tricks(isolation):
    """The host's /etc/passwd through /proc/self/root, /proc/1/root, the parent's root and cwd
    climbing out of the run's folder."""
    code = """
        import os
        for path in ['/proc/self/root/etc/passwd', '/proc/1/root/etc/passwd',
                     f'/proc/{os.getppid()}/root/etc/passwd', '/proc/self/cwd/../../etc/passwd',
                     '/proc/self/cwd/../../../etc/passwd', '/proc/self/cwd/../../../../etc/passwd']:
            try:
                print(open(path).read(), end='')
                break
            except OSError:
                pass
    """
    run = box(isolation, code)
    expect_escape(isolation, run.stdout == Path("/etc/passwd").read_text(), run)


@pytest.mark.parametrize("isolation", BOXES)
def test_reading_through_a_symlink(isolation, host):
    code = with_libc(f"""
        libc.symlink({str(host / "secret.txt")!r}.encode(), b'innocent.txt')
        print(open('innocent.txt').read())
    """)
    run = box(isolation, code)
    expect_escape(isolation, "the host's secret" in run.stdout, run)


# ---- writing to the host ---------------------------------------------------------------------


@pytest.mark.parametrize("isolation", BOXES)
def test_writing_outside_through_a_dir_fd(isolation, host):
    code = f"""
        import os
        folder = os.open({str(host)!r}, os.O_RDONLY)
        out = os.open('escaped.txt', os.O_WRONLY | os.O_CREAT, dir_fd=folder)
        os.write(out, b'out')
    """
    run = box(isolation, code)
    expect_escape(isolation, (host / "escaped.txt").exists(), run)


@pytest.mark.parametrize("isolation", BOXES)
def test_writing_outside_through_a_symlinked_folder(isolation, host):
    code = with_libc(f"""
        libc.symlink({str(host)!r}.encode(), b'folder')
        out = os.open('escaped.txt', os.O_WRONLY | os.O_CREAT, dir_fd=os.open('folder', 0))
        os.write(out, b'out')
    """)
    run = box(isolation, code)
    expect_escape(isolation, (host / "escaped.txt").exists(), run)


@pytest.mark.parametrize("isolation", BOXES)
def test_overwriting_a_host_file_through_a_hard_link(isolation, host):
    code = with_libc(f"""
        libc.link({str(host / "secret.txt")!r}.encode(), b'mine.txt')
        open('mine.txt', 'w').write('overwritten')
    """)
    run = box(isolation, code)
    expect_escape(isolation, (host / "secret.txt").read_text() == "overwritten", run)


@pytest.mark.parametrize("isolation", BOXES)
def test_libc_system_runs_a_shell_command_on_the_host(isolation, host):
    marker = host / "id.txt"
    run = box(isolation, f"{LIBC}\nprint(libc.system(b'id > {marker}'))")
    expect_escape(isolation, marker.exists() and "uid=" in marker.read_text(), run)


# ---- processes and the network ---------------------------------------------------------------


@pytest.mark.parametrize("isolation", BOXES)
def test_fork_1000_times_through_libc(isolation):
    """Each child exits at once and stays a zombie, so every fork made counts."""
    code = with_libc("""
        made = 0
        for _ in range(1000):
            pid = libc.fork()
            if pid == 0:
                libc._exit(0)
            if pid < 0:
                break
            made += 1
        print(made)
    """)
    run = box(isolation, code, wall_s=30)
    if isolation == "audit-hooks" and not AS_ROOT:
        pytest.skip("RLIMIT_NPROC holds in the weak box too for a user other than root")
    expect_escape(isolation, run.stdout == "1000\n", run)


@pytest.mark.parametrize("isolation", BOXES)
def test_connecting_to_a_loopback_server_through_libc(isolation):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = with_libc(f"""
            import struct
            # struct sockaddr_in: AF_INET, the port in network order, 127.0.0.1, padding
            address = struct.pack('=H', 2) + struct.pack('>H4s8x', {port}, bytes([127, 0, 0, 1]))
            fd = libc.socket(2, 1, 0)
            print(fd, libc.connect(fd, address, len(address)), os.strerror(ctypes.get_errno()))
        """)
        run = box(isolation, code)
        server.setblocking(False)
        try:
            connection, _ = server.accept()
            connection.close()
            connected = True
        except BlockingIOError:
            connected = False
    expect_escape(isolation, connected, run)


# ---- what only the namespace box promises ----------------------------------------------------


def namespace_box(code: str, **limits) -> str:
    run = box("namespaces", code, **limits)
    assert run.error is None, run
    return run.stdout


def test_the_box_runs_as_an_unprivileged_user_without_capabilities():
    out = namespace_box("""
        import os
        status = dict(line.split(':\\t', 1) for line in open('/proc/self/status'))
        print(os.getuid(), status['CapEff'].strip(), status['CapBnd'].strip())
    """)
    uid = 65534 if AS_ROOT else os.getuid()
    assert out == f"{uid} 0000000000000000 0000000000000000\n"


def test_the_box_sees_its_own_folder_and_processes_and_a_fixed_environment():
    out = namespace_box("""
        import os
        print(os.getcwd(), sorted(p for p in os.listdir('/proc') if p.isdigit()))
        print(sorted(os.listdir('/')))
        print(sorted(os.environ))
    """)
    cwd_and_pids, root, environment = out.splitlines()
    assert cwd_and_pids == "/sandbox ['1', '2']"  # the box's init and the code
    # The root holds the box's own folders and the first folder of each path it shows of the
    # interpreter (a venv under /tmp/ci shows as /tmp/ci/.venv alone), nothing else of the host.
    binds, symlinks = interpreter_view()
    shown = {path.strip("/").split("/", 1)[0] for path in [*binds, *symlinks]}
    assert set(eval(root)) == {"sandbox", "proc", "dev"} | shown
    assert "etc" not in shown and "home" not in shown
    assert eval(environment) == sorted(
        ["HOME", "LANG", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"]
        + ["PATH", "TMPDIR"]
    )


def test_the_interpreters_files_are_read_only_and_cannot_be_remounted():
    out = namespace_box(
        with_libc("""
        import sys
        planted = os.path.join(sys.base_prefix, 'planted.py').encode()
        print(libc.open(planted, os.O_WRONLY | os.O_CREAT, 0o644), ctypes.get_errno())
        remount = libc.mount(None, sys.base_prefix.encode(), None, 32 | 4096, None)
        print(remount, ctypes.get_errno())
        print(libc.unshare(0x10000000), ctypes.get_errno())
    """)
    )
    # EROFS for a file planted past the audit hook, EPERM for the remount (no capability),
    # ENOSPC for a nested user namespace (none allowed inside).
    assert out.splitlines() == ["-1 30", "-1 1", "-1 28"]


@pytest.mark.parametrize("max_processes", [4, 16])
def test_rlimit_nproc_allows_exactly_max_processes_more(max_processes):
    """The launcher, the box's init and the code count as three: max_processes + 3 in all."""
    code = with_libc("""
        made = 0
        while made < 100 and (pid := libc.fork()) != -1:
            if pid == 0:
                libc._exit(0)
            made += 1
        print(made, ctypes.get_errno())
    """)
    out = namespace_box(code, max_processes=max_processes)
    assert out == f"{max_processes} 11\n"  # EAGAIN


def test_the_boxs_processes_end_with_the_run(tmp_path):
    """A child that outlives the code (forked past the hooks, sleeping) is gone when the run
    returns: the box's init takes its PID namespace down with it."""
    code = f"{LIBC}\nif libc.fork() == 0:\n    libc.sleep(60)\nprint('parent done')"
    run = run_python(code, SandboxLimits(root=str(tmp_path)))
    assert run.stdout == "parent done\n"
    assert [line for line in running_command_lines() if str(tmp_path) in line] == []


# ---- the box's init, its disk and what it shows of the host -----------------------------------

PTRACE_INIT = with_libc("""
    import errno
    PTRACE_ATTACH, PTRACE_DETACH = 16, 17
    attached = libc.ptrace(PTRACE_ATTACH, 1, None, None)
    print('attach', attached, errno.errorcode.get(ctypes.get_errno()))
    if attached == 0:
        os.waitpid(1, 0x40000000)  # __WALL: the stop that attaching causes
        libc.ptrace(PTRACE_DETACH, 1, None, None)
    mem = libc.open(b'/proc/1/mem', os.O_RDWR)  # past the hook, which refuses any write
    print('mem', mem, errno.errorcode.get(ctypes.get_errno()))
    # One byte to address 4096 of init: EPERM where the kernel refuses the access, EFAULT
    # where it let the call reach init's (unmapped) page.
    class iovec(ctypes.Structure):
        _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
    byte = ctypes.create_string_buffer(1)
    local, remote = iovec(ctypes.addressof(byte), 1), iovec(4096, 1)
    libc.process_vm_writev.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong,
                                       ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    wrote = libc.process_vm_writev(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    print('vm_writev', wrote, errno.errorcode.get(ctypes.get_errno()))
    try:  # its descriptors: the pipe on which it reports how the code ended
        print('fds', os.listdir('/proc/1/fd'))
    except OSError as error:
        print('fds', errno.errorcode[error.errno])
""")


def test_the_code_cannot_attach_to_or_write_into_the_boxs_init():
    """The box's init (PID 1) runs without the hooks; a tracer of it could write /proc/1/mem and
    run anything as it (a tester re-executed Python as PID 1 that way, with the host's limits).
    Attaching, opening its memory for writing, process_vm_writev into it (EPERM: not EFAULT,
    which would mean the kernel let the call reach init's memory) and its descriptors (its
    report pipe: a forged exit status) are refused."""
    out = namespace_box(PTRACE_INIT)
    refused = ["attach -1 EPERM", "mem -1 EACCES", "vm_writev -1 EPERM", "fds EACCES"]
    assert out.splitlines() == refused


def test_the_boxs_init_holds_the_codes_limits_and_filter():
    """Were init reached all the same, it could not fork, allocate or write past the limits."""
    out = namespace_box("""
        def seccomp(pid):
            return open(f'/proc/{pid}/status').read().split('Seccomp:')[1].split()[0]
        print(open('/proc/1/limits').read() == open('/proc/self/limits').read())
        print(seccomp(1), seccomp('self'))
    """)
    assert out == "True\n2 2\n"  # SECCOMP_MODE_FILTER in both


def test_the_code_cannot_ptrace_its_own_child():
    """The worker's seccomp filter: no ptrace at all, even of a process it may otherwise touch."""
    code = with_libc("""
        import errno, signal
        child = libc.fork()
        if child == 0:
            libc.pause()
            libc._exit(0)
        print(libc.ptrace(16, child, None, None), errno.errorcode.get(ctypes.get_errno()))
        libc.kill(child, signal.SIGKILL)
    """)
    assert namespace_box(code) == "-1 EPERM\n"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64's other system call tables")
def test_the_filter_refuses_the_32_bit_and_x32_entry_points():
    """A 64-bit process may still call the kernel's 32-bit table (int 0x80, where ptrace is 26)
    and x32's numbers; the filter refuses all of those, not only the three names. Shown with
    getpid, which the kernel (with IA-32 emulation) answers unfiltered."""
    code = with_libc("""
        import mmap
        # mov eax, 20 (getpid in the 32-bit table); int 0x80; ret
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))
        getpid_32 = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
        print(getpid_32(), libc.syscall(0x40000000 | 39), ctypes.get_errno())
    """)
    assert namespace_box(code) == "-1 -1 1\n"  # -EPERM from int 0x80; EPERM for x32's getpid


FILL_THE_DISK = """
    import errno, os
    def made_until_full(write_one, most):
        for made in range(most):
            try:
                write_one(made)
            except OSError as error:
                return made, errno.errorcode[error.errno]
        return most, None
    def small(n):
        open(f'small-{n}', 'w').close()
    def big(n):
        with open(f'big-{n}', 'wb') as file:
            file.write(bytes(4 << 20))
    print(*made_until_full(small, 5000))
    for name in os.listdir():
        if name.startswith('small-'):
            os.remove(name)
    print(*made_until_full(big, 100))
"""


@pytest.mark.parametrize(
    "limits, files_made, bigs_made",
    [
        # The defaults: 4,096 inodes (the folder and main.py hold two), 64 MiB (16 files of
        # 4 MiB, of which main.py's page takes part of the last one).
        ({}, 4094, 15),
        ({"max_files": 10, "disk_mb": 9}, 8, 2),
    ],
)
def test_the_boxs_disk_holds_so_many_files_and_bytes(limits, files_made, bigs_made):
    """Before the quota one run wrote 2 GiB to the host's temporary disk in 1.9 s."""
    out = namespace_box(FILL_THE_DISK, wall_s=60, **limits)
    assert out.splitlines() == [f"{files_made} ENOSPC", f"{bigs_made} ENOSPC"]


def test_the_box_shows_no_host_path_but_the_interpreters(tmp_path):
    """/proc/self/mountinfo names each mount's root in its filesystem and its mount point;
    /proc/mounts the mount points. The only host paths these may name are the interpreter's
    folders (which the box shows at their own paths): not the run's folder, not the home."""
    code = "print(open('/proc/self/mountinfo').read())\nprint(open('/proc/mounts').read())"
    run = run_python(code, SandboxLimits(root=str(tmp_path)))
    assert run.error is None, run
    mountinfo, mounts = run.stdout.split("\n\n", 1)
    binds, _ = interpreter_view()
    devices = [f"/dev/{device}" for device in ("null", "zero", "full", "random", "urandom")]
    shown = {"/", "/sandbox", "/proc", *devices, *binds, *binds.values()}
    roots = {device.removeprefix("/dev") for device in devices}
    for line in mountinfo.splitlines():
        root, mount_point = line.split()[3:5]
        assert root in shown | roots and mount_point in shown, line
    for line in mounts.strip().splitlines():
        assert line.split()[1] in shown, line
    # The home may show only as the start of an interpreter's folder (a Python under /root).
    outside_the_interpreter = run.stdout
    for folder in sorted({*binds, *binds.values()}, key=len, reverse=True):
        outside_the_interpreter = outside_the_interpreter.replace(folder, "")
    assert str(tmp_path) not in outside_the_interpreter
    assert str(Path.home()) not in outside_the_interpreter


# ---- the kernel refusing namespaces ----------------------------------------------------------


@pytest.mark.skipif(not shutil.which("unshare"), reason="util-linux's unshare is not installed")
def test_a_kernel_that_refuses_namespaces_stops_the_tool_with_the_setting_to_use():
    """In a user namespace whose limit of nested user namespaces is 0 the kernel refuses the
    box for real; the tool must not start (no silent fallback), and its error must name the
    setting that accepts the weaker box; with that setting, the tool runs there."""
    script = (
        "from envs.sandbox import SandboxLimits, SandboxUnavailable\n"
        "from envs.tools import PythonTool\n"
        "try:\n    PythonTool()\nexcept SandboxUnavailable as error:\n    print('refused:', error)\n"
        "weak = PythonTool(limits=SandboxLimits(isolation='audit-hooks'))\n"
        "print('weak box:', weak.execute({'code': 'print(6 * 7)'}))\n"
    )
    refusing = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -c "$1"'
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", refusing]
        + [sys.executable, script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    refused, weak = done.stdout.splitlines()
    assert refused.startswith("refused: the python tool's namespace box could not start")
    assert "unshare(user, mount, pid, net): No space left on device" in refused
    assert refused.endswith("set env.qa.python_isolation=audit-hooks")
    assert weak == "weak box: 42"


def test_the_tool_in_the_namespace_box_prints():
    assert PythonTool().execute({"code": "print(sum(range(10)))"}) == "45"


@pytest.mark.parametrize("limits", [{"disk_mb": 0}, {"max_files": 1}])
def test_a_quota_with_no_room_for_the_code_is_refused_naming_the_settings(limits):
    with pytest.raises(ValueError, match="set disk_mb >= 1 and max_files >= 2"):
        SandboxLimits(**limits)


def test_code_larger_than_the_quota_is_the_runs_error_not_a_broken_box():
    """main.py is written inside the box, under its limits: code past them fails as a run."""
    run = run_python("x = 1\n" + "#" * (2 * 2**20), SandboxLimits(disk_mb=1))
    assert run.error == "OSError: [Errno 28] No space left on device"
