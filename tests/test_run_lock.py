"""The run lock: one process at a time per run_name and store, on a local folder and on S3;
a dead holder's lock is taken over, a live one's only with break_lock; runs and campaign rounds
hold it, and a campaign waiting for its slot never deadlocks on it. No vLLM, no trainer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from prefect import flow

from ops import run_lock
from ops.run_lock import LockRecord, RunLock, RunLocked, new_record


def plant(lock: RunLock, **changes) -> LockRecord:
    """Write a lock as another holder would have left it."""
    record = new_record(lock.run_name).model_copy(update=changes)
    lock.fs.makedirs(lock.path.rsplit("/", 1)[0], exist_ok=True)
    with lock.fs.open(lock.path, "wb") as f:
        f.write(record.model_dump_json().encode())
    return record


def test_a_second_holder_is_refused_with_the_holders_name(tmp_path):
    first, second = RunLock(str(tmp_path), "eto-x"), RunLock(str(tmp_path), "eto-x")
    with first.hold():
        with pytest.raises(RunLocked) as refused:
            second.acquire()
        message = str(refused.value)
        assert f"run 'eto-x' is held by {socket.gethostname()}/pid {os.getpid()} since" in message
        assert "--break-lock" in message and "break_lock=true" in message
        RunLock(str(tmp_path), "other-run").acquire()  # other runs are not held
    assert first.holder() is None  # given back
    with second.hold():
        assert second.holder().token == second.record.token


def test_of_runs_racing_for_the_lock_exactly_one_gets_it(tmp_path):
    locks = [RunLock(f"file://{tmp_path}", "race") for _ in range(6)]
    start = threading.Barrier(len(locks))
    won = []

    def take(lock):
        start.wait()
        try:
            lock.acquire()
            won.append(lock)
        except RunLocked:
            pass

    threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and won[0].holder().token == won[0].record.token


def test_a_dead_holder_on_this_host_is_taken_over(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = run_lock.process_started(holder.pid)
    holder.kill()
    holder.wait()
    lock = RunLock(str(tmp_path), "eto-x")
    plant(lock, pid=holder.pid, process_started=started)
    lock.acquire()
    assert f"process {holder.pid} no longer runs on this host" in capsys.readouterr().out
    assert lock.holder().pid == os.getpid()


def test_an_expired_heartbeat_is_taken_over_and_a_live_one_is_not(tmp_path):
    lock = RunLock(str(tmp_path), "eto-x")
    plant(lock, host="elsewhere", pid=1, heartbeat=time.time() - 10)
    with pytest.raises(RunLocked, match="held by elsewhere/pid 1"):
        lock.acquire()
    plant(lock, host="elsewhere", pid=1, heartbeat=time.time() - run_lock.LEASE_S - 5)
    lock.acquire()
    assert lock.holder().host == socket.gethostname()


def test_break_lock_takes_a_live_lock_and_its_holder_notices(tmp_path, capsys):
    holder, breaker = RunLock(str(tmp_path), "eto-x"), RunLock(str(tmp_path), "eto-x")
    holder.acquire()
    with pytest.raises(RunLocked):
        breaker.check()
    breaker.check(break_lock=True)
    breaker.acquire(break_lock=True)
    assert "break_lock was given" in capsys.readouterr().out
    holder.heartbeat()
    assert holder.lost and "lost the lock" in capsys.readouterr().out
    holder.release()  # must not remove the lock it lost
    assert breaker.holder().token == breaker.record.token


def test_the_holder_renews_its_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.2)
    lock = RunLock(str(tmp_path), "eto-x")
    with lock.hold():
        first = lock.holder().heartbeat
        time.sleep(1.0)
        assert lock.holder().heartbeat > first
        assert not lock.lost


def test_the_lock_works_on_s3(s3_store):
    """On moto's S3 (the shared `s3_store` fixture)."""
    first, second = RunLock(s3_store.root, "eto-x"), RunLock(s3_store.root, "eto-x")
    with first.hold():
        with pytest.raises(RunLocked, match="is held by"):
            second.acquire()
        first.heartbeat()
        assert not first.lost
    assert first.holder() is None
    second.acquire()
    assert second.holder().token == second.record.token


def test_cli_refuses_a_run_held_elsewhere_before_any_work(tmp_path, capsys):
    from flows.eto import main

    lock = RunLock(str(tmp_path / "runs"), "eto-textcraft")
    plant(lock, host="gpu-7", pid=4242)
    database = tmp_path / "mlflow.db"
    code = main([f"storage_url={tmp_path}/runs", f"mlflow_tracking_uri=sqlite:///{database}"])
    error = capsys.readouterr().err
    assert code == 2, error
    assert "run 'eto-textcraft' is held by gpu-7/pid 4242" in error and "--break-lock" in error
    assert "Traceback" not in error
    assert not database.exists()  # refused before the MLflow store was created


TOY = {"storage_url": None, "run_name": "toy", "env": {"train_tasks": 2, "test_tasks": 1}}


def sleepy_body(cfg, store, tracking, *extra):
    time.sleep(3)
    return "done"


@flow(name="toy-run")
def toy_run(config: dict):
    from flows.eto import ETOConfig
    from ops.runner import run_tracked

    return run_tracked(ETOConfig.model_validate(config), sleepy_body)


def test_two_runs_of_one_run_name_never_work_at_once(tmp_path):
    from prefect.client.orchestration import get_client

    config = {**TOY, "storage_url": str(tmp_path / "store")}
    with get_client(sync_client=True) as client:
        client.hello()  # the ephemeral API starts once, before two runs race to start it
    states = []
    threads = [
        threading.Thread(target=lambda: states.append(toy_run(config, return_state=True)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
        time.sleep(0.5)
    for thread in threads:
        thread.join()
    assert sorted(s.type.value for s in states) == ["COMPLETED", "FAILED"]
    failed = next(s for s in states if s.is_failed())
    assert "run 'toy' is held by" in str(failed.result(raise_on_failure=False))
    assert RunLock(config["storage_url"], "toy").holder() is None


def test_a_campaign_round_meets_a_held_run_with_a_refusal_not_a_deadlock(tmp_path):
    from test_campaign import toy_campaign

    config = {**TOY, "storage_url": str(tmp_path / "store"), "rounds": 1}
    plain_run = RunLock(config["storage_url"], "toy")
    with plain_run.hold():
        started = time.monotonic()
        refused = toy_campaign(config, return_state=True)
        assert refused.is_failed() and time.monotonic() - started < 120
        assert "run 'toy' is held by" in str(refused.result(raise_on_failure=False))
    assert toy_campaign(config, return_state=True).is_completed()  # its slot was given back
