"""A run told to stop while stages start vLLM's engine or a trainer stops at once (issue 67).

Found by a tester: SIGTERM to a flow while its two exploration shards started vLLM took 57 to
93 s to end it: `release_vllm` waited on the engine lock the load held, and the stages went on
to start new engines. Here vLLM's `LLM` is a stand-in whose engine core is a real child process
named as vLLM names it; like vLLM's, its load fails once that process dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import flywheel.inference as inference
from flywheel.stopping import RunStopped, resume_runs, stop_run
from ops.shutdown import stopping_children_on_error

REPO = Path(__file__).resolve().parent.parent

# A stand-in engine core: named as vLLM names its own, says when it runs, waits (a slow load).
ENGINE_CORE = """
import ctypes, time
ctypes.CDLL(None).prctl(15, b"VLLM::EngineCor", 0, 0, 0)
print("loading", flush=True)
time.sleep(120)
"""


class SlowLLM:
    """vLLM's `LLM` whose engine core loads for 2 minutes; its load fails, as vLLM's does, when
    the core dies ("Engine core initialization failed")."""

    starts: list[subprocess.Popen] = []
    loading = threading.Event()

    def __init__(self, **engine_args):
        core = subprocess.Popen([sys.executable, "-c", ENGINE_CORE], stdout=subprocess.PIPE)
        SlowLLM.starts.append(core)
        core.stdout.readline()  # named and running
        SlowLLM.loading.set()
        core.wait()
        raise RuntimeError("Engine core initialization failed. See root cause above.")


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """`from vllm import LLM` gets `llm_class`; the run starts unstopped and ends so."""

    def use(llm_class):
        monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=llm_class))
        return str(tmp_path)  # the model folder: the stand-in reads nothing

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    monkeypatch.setattr(inference, "_engine", None)
    SlowLLM.starts, SlowLLM.loading = [], threading.Event()
    resume_runs()
    yield use
    resume_runs()
    for core in SlowLLM.starts:
        core.kill()
        core.wait()


def in_thread(function) -> tuple[threading.Thread, dict]:
    outcome = {}

    def run():
        try:
            outcome["result"] = function()
        except BaseException as error:  # what the stage (or the flow's main thread) sees
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def sigterm_in_main_thread():
    """What a flow's main thread does when Prefect turns a SIGTERM into an exception."""
    from prefect.exceptions import TerminationSignal

    with stopping_children_on_error():
        raise TerminationSignal(signal.SIGTERM)


def test_sigterm_while_an_engine_loads_kills_it_and_no_stage_starts_another(fake_vllm):
    model_dir = fake_vllm(SlowLLM)
    shard, shard_outcome = in_thread(
        lambda: inference.shared_vllm(model_dir, 512, 1, sampling=False)
    )
    assert SlowLLM.loading.wait(30), "the stand-in engine never started loading"

    started = time.monotonic()
    main, _ = in_thread(sigterm_in_main_thread)
    main.join(20)
    stop_s = time.monotonic() - started
    assert not main.is_alive(), "stopping waited on the engine that was loading"
    assert stop_s < 5, f"stopping took {stop_s:.1f} s"
    shard.join(10)
    assert not shard.is_alive(), "the loading stage did not end"

    error = shard_outcome["error"]
    assert isinstance(error, RunStopped), error
    assert "stopped by SIGTERM" in str(error)
    assert "Engine core initialization failed" not in str(error)
    assert SlowLLM.starts[0].poll() is not None, "the loading engine core still runs"

    with pytest.raises(RunStopped, match="stopped by SIGTERM: not starting vLLM's engine"):
        inference.shared_vllm(model_dir, 512, 1, sampling=False)  # the other shard's next engine
    assert len(SlowLLM.starts) == 1, "an engine started after the stop"


def test_an_engine_whose_load_ends_after_the_stop_is_closed_by_its_own_thread(
    fake_vllm, monkeypatch
):
    """A load vLLM runs without an engine process to kill: `release_vllm` gives up waiting, and
    the loading thread closes what it got."""
    release, shut_down = threading.Event(), []

    class InProcessLLM:  # vLLM loading in this process: nothing to kill
        def __init__(self, **engine_args):
            SlowLLM.loading.set()
            release.wait(60)
            self.llm_engine = types.SimpleNamespace(shutdown=lambda: shut_down.append(self))

    model_dir = fake_vllm(InProcessLLM)
    monkeypatch.setattr(inference, "ENGINE_ABANDON_S", 0.5)
    shard, outcome = in_thread(lambda: inference.shared_vllm(model_dir, 512, 1, sampling=False))
    assert SlowLLM.loading.wait(30), outcome
    main, _ = in_thread(sigterm_in_main_thread)
    main.join(10)
    assert not main.is_alive(), "stopping waited on the engine that was loading"

    release.set()  # the load completes after the stop
    shard.join(10)
    assert isinstance(outcome.get("error"), RunStopped), outcome
    assert "stopped by SIGTERM" in str(outcome["error"])
    assert len(shut_down) == 1, "the engine loaded after the stop was left running"
    assert inference._engine is None


def test_a_normal_release_still_waits_for_a_load_and_closes_its_engine(fake_vllm, monkeypatch):
    """Not stopping (a training stage freeing memory): `release_vllm` waits for the load."""
    release, shut_down = threading.Event(), []

    class QuickLLM:
        def __init__(self, **engine_args):
            SlowLLM.loading.set()
            release.wait(60)
            self.llm_engine = types.SimpleNamespace(shutdown=lambda: shut_down.append(self))

    model_dir = fake_vllm(QuickLLM)
    monkeypatch.setattr(inference, "kv_cache_blocks", lambda *args: 8)  # no model config here
    shard, outcome = in_thread(lambda: inference.shared_vllm(model_dir, 512, 1, sampling=False))
    assert SlowLLM.loading.wait(30), outcome
    releasing, _ = in_thread(inference.release_vllm)
    releasing.join(0.5)
    assert releasing.is_alive(), "a normal release did not wait for the load"
    release.set()
    shard.join(10)
    releasing.join(10)
    assert "result" in outcome, outcome
    assert len(shut_down) == 1, "the loaded engine was not closed"
    assert inference._engine is None


def test_no_trainer_starts_once_the_run_is_stopping(monkeypatch, tmp_path):
    from training import launch

    started = []
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: started.append(a))
    stop_run("the run was stopped by SIGTERM")
    try:
        with pytest.raises(RunStopped, match="stopped by SIGTERM: not starting trainer"):
            launch.launch("training.sft", tmp_path / "job.json", tmp_path / "train.log")
    finally:
        resume_runs()
    assert started == []


def test_a_trainer_started_as_the_run_stops_is_stopped_at_once(monkeypatch, tmp_path):
    """The stop lands between launch's check and its trainer joining the list that
    `stop_trainers` stops: launch sees it and stops the trainer itself."""
    from training import launch

    popen, trainers = subprocess.Popen, []

    def start_then_stop(cmd, **kwargs):
        trainers.append(popen(["sleep", "60"], **kwargs))
        stop_run("the run was stopped by SIGTERM")  # stop_trainers ran before the list has it
        return trainers[-1]

    monkeypatch.setattr(launch.subprocess, "Popen", start_then_stop)
    started = time.monotonic()
    try:
        with pytest.raises(RunStopped, match="stopped by SIGTERM"):
            launch.launch("training.sft", tmp_path / "job.json", tmp_path / "train.log")
    finally:
        resume_runs()
    assert trainers[0].poll() is not None, "the trainer still runs"
    assert time.monotonic() - started < 10


# A flow process whose two stages (threads, as ETO's exploration shards) start vLLM's engine on
# the same model with other settings: the second waits for the first's load, then replaces it.
TWO_SHARDS_START_VLLM = """
import sys, threading
from ops.shutdown import flow_process, stopping_children_on_error
from flywheel.inference import shared_vllm

def shard(max_model_len):
    try:
        shared_vllm(sys.argv[1], max_model_len, 1, sampling=False)
        outcome = "shard loaded"
    except BaseException as error:  # the stage's failure record
        outcome = "shard failed: " + str(error).splitlines()[0]
    sys.stdout.write(outcome + "\\n")  # one write: the shards' lines stay whole
    sys.stdout.flush()

with flow_process():
    with stopping_children_on_error():
        shards = [threading.Thread(target=shard, args=(n,)) for n in (256, 512)]
        for thread in shards:
            thread.start()
        for thread in shards:
            thread.join()
"""


def group_processes(group: int) -> list:
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == group and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


@pytest.mark.slow
def test_sigterm_to_the_group_while_two_shards_start_vllm_stops_it_within_30_s(tiny_model_dir):
    import psutil

    flow = subprocess.Popen(
        [sys.executable, "-c", TWO_SHARDS_START_VLLM, str(tiny_model_dir)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(c.name().startswith("VLLM") for c in psutil.Process(flow.pid).children()):
            assert time.monotonic() < deadline and flow.poll() is None, "no engine started"
            time.sleep(0.2)
        os.killpg(flow.pid, signal.SIGTERM)  # as a person's kill -- -PGID, or a scheduler's
        signalled = time.monotonic()
        out, _ = flow.communicate(timeout=120)
        exit_s = time.monotonic() - signalled
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(flow.pid, signal.SIGKILL)
    print(f"exit {flow.returncode} {exit_s:.1f} s after SIGTERM; output:\n{out}")
    assert exit_s < 30, f"the flow exited {exit_s:.0f} s after SIGTERM:\n{out}"
    assert "shard loaded" not in out, out
    assert out.count("shard failed: the run was stopped by SIGTERM") == 2, out
    time.sleep(1)
    assert group_processes(flow.pid) == [], "processes of the flow outlived it"
