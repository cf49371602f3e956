"""A closed vLLM engine leaves no zombie: `reap_engine_processes` collects the ended children that
vLLM named (`VLLM::EngineCore`), and no other child's exit status."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from flywheel.inference import reap_engine_processes

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


# An engine core that starts a worker ignoring SIGTERM (as a busy one may not get to it), then
# waits: the test kills it, as vLLM's shutdown does, which leaves the worker to init.
ENGINE_WITH_WORKER = """
import ctypes, subprocess, sys, time
ctypes.CDLL(None).prctl(15, b"VLLM::EngineCor", 0, 0, 0)
worker = '''
import ctypes, signal, time
ctypes.CDLL(None).prctl(15, b"VLLM::Worker", 0, 0, 0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
'''
subprocess.Popen([sys.executable, "-c", worker], stdout=sys.stdout)
time.sleep(120)
"""


def test_a_closed_engines_worker_that_outlives_its_core_is_stopped():
    from flywheel.inference import engine_processes, stop_engine_processes

    engine = subprocess.Popen([sys.executable, "-c", ENGINE_WITH_WORKER], stdout=subprocess.PIPE)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert engine.stdout.readline().strip() == b"ready"
        found = engine_processes()
        names = sorted(p.name() for p in found)
        assert names == ["VLLM::EngineCor", "VLLM::Worker"]  # the bystander is no engine's
        worker = next(p for p in found if p.name() == "VLLM::Worker")
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
