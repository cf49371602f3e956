"""One run at a time per `run_name` in an artifact store: a lock file in the run's folder.

Two runs of one `run_name` would train into the same folders and publish over each other, so a
run holds `<store>/<run_name>/.flywheel-run.lock` while it works. The file says who holds it
(host, pid, when it started) and a heartbeat the holder rewrites every `HEARTBEAT_S`; it is
created exclusively (O_EXCL on a local folder, a conditional put on S3), so of two runs starting
together exactly one gets it and the other is refused with the holder's name.

A holder that died leaves its file behind. It is taken over without asking when it is provably
stale: its heartbeat is older than `LEASE_S`, or it names a process on this host that no longer
runs. Otherwise `break_lock` (`--break-lock`, `break_lock=true`) takes it over by force.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime

import fsspec
from pydantic import BaseModel

LOCK_FILE = ".flywheel-run.lock"
HEARTBEAT_S = 20.0  # how often a live holder rewrites its lock
LEASE_S = 120.0  # a lock not rewritten for this long belongs to a dead or frozen process


class RunLocked(RuntimeError):
    """Another process holds the run; the message names it and what to do."""


class LockRecord(BaseModel):
    run_name: str
    host: str
    pid: int
    process_started: float  # the holder's start time: a pid reused later is another process
    started_at: str
    heartbeat: float  # time.time() of the holder's last rewrite
    token: str  # this holding's id: a rewritten or broken lock is no longer ours

    def describe(self) -> str:
        return f"{self.host}/pid {self.pid} since {self.started_at}"

    def stale_because(self, now: float) -> str | None:
        """Why the holder is certainly gone, or None when it may be alive."""
        if now - self.heartbeat > LEASE_S:
            return f"its heartbeat is {now - self.heartbeat:.0f} s old (lease {LEASE_S:.0f} s)"
        if self.host == socket.gethostname() and not process_alive(self.pid, self.process_started):
            return f"process {self.pid} no longer runs on this host"
        return None


def process_started(pid: int) -> float:
    import psutil

    return psutil.Process(pid).create_time()


def process_alive(pid: int, started: float) -> bool:
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except psutil.NoSuchProcess:
        return False


class RunLock:
    """The lock of `run_name` in the store at `store_url`; `hold()` takes it for a block."""

    def __init__(self, store_url: str, run_name: str):
        self.run_name = run_name
        self.url = f"{store_url.rstrip('/')}/{run_name.strip('/')}/{LOCK_FILE}"
        self.fs, self.path = fsspec.core.url_to_fs(self.url)
        self.record: LockRecord | None = None
        self.lost = False  # set when another process broke or rewrote the lock under us
        self._stop = threading.Event()

    # Reading ---------------------------------------------------------------------------------

    def holder(self) -> LockRecord | None:
        """The current lock, or None when nobody holds the run."""
        for _ in range(3):  # a heartbeat being replaced reads as missing or partial for a moment
            try:
                with self.fs.open(self.path, "rb") as f:
                    return LockRecord.model_validate_json(f.read())
            except FileNotFoundError:
                return None
            except ValueError:
                time.sleep(0.2)
        return None

    def refusal(self, held: LockRecord) -> RunLocked:
        age = time.time() - held.heartbeat
        return RunLocked(
            f"run {self.run_name!r} is held by {held.describe()} (heartbeat {age:.0f} s ago; "
            f"{self.url}); wait for it to finish, or pass --break-lock / break_lock=true if "
            "that process is gone"
        )

    def check(self, break_lock: bool = False) -> None:
        """Refuse now, before any work, if a live process holds the run."""
        held = self.holder()
        if held and not break_lock and not held.stale_because(time.time()):
            raise self.refusal(held)

    # Taking and giving back -------------------------------------------------------------------

    def acquire(self, break_lock: bool = False) -> None:
        record = new_record(self.run_name)
        for _ in range(3):  # a lock released or broken between our tries: try again
            if self._create(record):
                self.record = record
                return
            held = self.holder()
            if held is None:
                continue
            reason = "break_lock was given" if break_lock else held.stale_because(time.time())
            if reason is None:
                raise self.refusal(held)
            print(f"taking over the lock of run {self.run_name!r} from {held.describe()}: {reason}")
            if (again := self.holder()) and again.token == held.token:  # not taken meanwhile
                self.fs.rm(self.path)
        held = self.holder()
        raise self.refusal(held) if held else RunLocked(f"could not take {self.url}; try again")

    def _create(self, record: LockRecord) -> bool:
        """Write the lock only if there is none: exactly one of two racing runs succeeds."""
        self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
        try:
            with self.fs.open(self.path, "xb") as f:
                f.write(record.model_dump_json().encode())
        except FileExistsError:  # s3fs raises it too when the conditional put fails
            return False
        held = self.holder()  # a store without exclusive create: the last writer wins
        return held is not None and held.token == record.token

    def heartbeat(self) -> None:
        """Rewrite the lock with a fresh heartbeat, if it is still ours."""
        held = self.holder()
        if held is None or self.record is None or held.token != self.record.token:
            if not self.lost:
                self.lost = True
                who = held.describe() if held else "nobody"
                print(f"warning: lost the lock of run {self.run_name!r} (now held by {who})")
            return
        self.record = self.record.model_copy(update={"heartbeat": time.time()})
        scratch = f"{self.path}.{self.record.token}"
        with self.fs.open(scratch, "wb") as f:
            f.write(self.record.model_dump_json().encode())
        self.fs.mv(scratch, self.path)  # readers see the old lock or the new one, whole

    def release(self) -> None:
        held = self.holder()
        if held and self.record and held.token == self.record.token:
            self.fs.rm(self.path)
        self.record = None

    @contextmanager
    def hold(self, break_lock: bool = False):
        """Hold the run for the block, heartbeating in a thread; give it back however the block
        ends (a killed process leaves it to go stale)."""
        self.acquire(break_lock)
        beats = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
        beats.start()
        try:
            yield self
        finally:
            self._stop.set()
            beats.join(timeout=10)
            self.release()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.heartbeat()
            except Exception as error:  # a store hiccup must not end the run; the lease is long
                print(f"warning: could not renew the lock of run {self.run_name!r}: {error!r}")


def new_record(run_name: str) -> LockRecord:
    now = time.time()
    return LockRecord(
        run_name=run_name,
        host=socket.gethostname(),
        pid=os.getpid(),
        process_started=process_started(os.getpid()),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        heartbeat=now,
        token=uuid.uuid4().hex,
    )
