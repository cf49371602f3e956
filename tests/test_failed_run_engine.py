"""A run that fails after vLLM's engine started leaves no engine process behind: the flow's
own failure path shuts the engine down before the process exits, so its watchdog finds nothing
to stop (no "flywheel watchdog: stopped" line) and no process of the run is alive after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent

FAILING_RUN = """
import json, sys, time
import psutil
from prefect import flow, task
from flows.eto import ETOConfig
from flywheel.storage import ArtifactStore
from ops.runner import run_tracked
from ops.shutdown import flow_process

def start_engine():
    from flywheel.inference import shared_vllm

    shared_vllm(sys.argv[2], 512, 1)
    # vLLM's engine and the resource tracker it started (not the watchdog or Prefect's server)
    engine = [c for c in psutil.Process().children(recursive=True)
              if "EngineCore" in c.name() + " ".join(c.cmdline())
              or "resource_tracker" in " ".join(c.cmdline())]
    with open(sys.argv[4], "w") as pids:  # not printed: Prefect takes a stage's prints
        pids.write(" ".join(str(c.pid) for c in engine))

@task
def engine_stage():
    time.sleep(3)  # the other stage has failed, and the stage flow has cleaned up, by now
    start_engine()

@task
def failing_stage():
    raise RuntimeError("a stage failed after the engine started")

def kill_engine_when_it_starts():
    import os, signal
    while True:
        for child in psutil.Process().children(recursive=True):
            # killed once it has started its worker (as the bench's kill met it): the worker
            # is orphaned
            if "EngineCore" in child.name() + " ".join(child.cmdline()) and child.children():
                engine = [c for c in psutil.Process().children(recursive=True)
                          if "uvicorn" not in " ".join(c.cmdline())
                          and "flywheel.watchdog" not in " ".join(c.cmdline())]
                with open(sys.argv[4], "w") as pids:
                    pids.write(" ".join(str(c.pid) for c in engine))
                os.kill(child.pid, signal.SIGKILL)
                return
        time.sleep(0.2)

def engine_then_failure(cfg, store, tracking):
    if sys.argv[3] == "engine-killed-at-start":  # as the chaos bench's vllm kill
        import threading
        threading.Thread(target=kill_engine_when_it_starts, daemon=True).start()
        start_engine()
    if sys.argv[3] == "in-the-body":
        start_engine()
        raise RuntimeError("a stage failed after the engine started")
    # a stage that comes to start its engine after another failed (it is refused: the run is
    # stopping)
    engine = engine_stage.submit()
    failing_stage.submit().result()
    engine.result()

@flow
def recipe(config: dict):
    cfg = ETOConfig.model_validate(config)
    return run_tracked(cfg, engine_then_failure, store=ArtifactStore(cfg.storage_url))

with flow_process():
    state = recipe(json.loads(sys.argv[1]), return_state=True)
print("final state:", state.type.value, state.message, flush=True)
sys.exit(0 if state.is_completed() else 1)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "where",
    [
        pytest.param("in-the-body", marks=pytest.mark.extended),
        "in-a-stage-still-running",
        pytest.param("engine-killed-at-start", marks=pytest.mark.extended),
    ],
)
def test_a_run_failing_after_the_engine_started_leaves_no_engine(where, tmp_path, tiny_model_dir):
    config = {
        "run_name": "engine-fails", "storage_url": str(tmp_path / "store"),
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "env": {"train_tasks": 2, "test_tasks": 1},
    }  # fmt: skip
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(REPO),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}  # fmt: skip
    # The watchdog shares the run's stderr: this returns once the watchdog has finished too.
    done = subprocess.run(
        [sys.executable, "-c", FAILING_RUN, json.dumps(config), str(tiny_model_dir), where,
         str(tmp_path / "engine-pids")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    assert "final state: FAILED" in done.stdout
    assert "flywheel watchdog" not in output, output[-4000:]
    if where == "in-a-stage-still-running":
        # The run was stopping when the stage came to start its engine: it refused, naming why
        # (flywheel/stopping.py), so no engine process was ever started.
        assert "not starting vLLM's engine" in output, output[-4000:]
        assert "a stage failed after the engine started" in output
        assert not (tmp_path / "engine-pids").exists()
        return
    engine_pids = [int(pid) for pid in (tmp_path / "engine-pids").read_text().split()]
    assert engine_pids, "the engine started no process: nothing was tested"
    assert not [pid for pid in engine_pids if psutil.pid_exists(pid)]
