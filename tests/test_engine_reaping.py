"""A closed vLLM engine leaves no zombie: `reap_engine_processes` collects the ended children that
vLLM named (`VLLM::EngineCore`), and no other child's exit status."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from flywheel.inference import reap_engine_processes
from tests.fake_engine import ENGINE_WITH_WORKER

# A child that names itself as vLLM names its engine core (prctl PR_SET_NAME), then exits.
NAMED_CHILD = """
import ctypes
ctypes.CDLL(None).prctl(15, b"VLLM::EngineCor", 0, 0, 0)
"""


def ended(process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while psutil.Process(process.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child did not end"
        time.sleep(0.05)


def test_an_ended_engine_process_is_reaped_and_another_child_keeps_its_status():
    engine = subprocess.Popen([sys.executable, "-c", NAMED_CHILD])
    trainer = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    ended(engine)
    ended(trainer)
    assert reap_engine_processes() == [engine.pid]
    assert not psutil.pid_exists(engine.pid) or (
        psutil.Process(engine.pid).status() != psutil.STATUS_ZOMBIE
    )
    assert trainer.wait() == 3  # its own waiter still reads its exit status


def test_a_closed_engines_worker_that_outlives_its_core_is_stopped():
    from flywheel.inference import engine_processes, stop_engine_processes

    engine = subprocess.Popen([sys.executable, "-c", ENGINE_WITH_WORKER], stdout=subprocess.PIPE)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        worker_pid = int(engine.stdout.readline())  # the worker runs
        found = engine_processes()
        names = sorted(p.name() for p in found)
        assert names == ["VLLM::EngineCor", "VLLM::Worker"]  # the bystander is no engine's
        worker = next(p for p in found if p.name() == "VLLM::Worker")
        assert worker.pid == worker_pid
        engine.kill()  # the shutdown: the core ends, its worker does not
        engine.wait()
        assert worker.is_running()
        assert stop_engine_processes(found, timeout=1.0) == [worker.pid]
        assert not worker.is_running()
        assert bystander.poll() is None  # left alone
    finally:
        engine.kill()
        bystander.kill()
        bystander.wait()
