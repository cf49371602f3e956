"""A campaign run SIGKILLed while it holds the campaign's slot does not block the next run.

Without a Prefect server (`PREFECT_API_URL` unset) each run starts a temporary server of its
own on `PREFECT_HOME`'s database; the slot's lease lives in that server's memory and dies with
the killed process, while the slot stays taken in the database, so the next run used to wait
forever. The run holding the slot now writes who it is into the store; the next run frees a
slot whose holder no longer runs, and says whose it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.storage import ArtifactStore
from ops.campaign import SLOT_HOLDER, load_campaign

REPO = Path(__file__).resolve().parent.parent

CAMPAIGN_RUN = """\
import json, sys, time
from prefect import flow
from flows.eto import ETOConfig
from ops.campaign import new_round, run_campaign

def sleepy_round(cfg, store, tracking, campaign):
    print("round started", flush=True)
    time.sleep(float(sys.argv[2]))
    published = new_round(len(campaign.rounds), "policy", [], [])
    return campaign.model_copy(update={"rounds": [*campaign.rounds, published]})

@flow(name="slot-campaign")
def slot_campaign(config: dict):
    return run_campaign(ETOConfig.model_validate(config), "toy", sleepy_round)

state = slot_campaign(json.loads(sys.argv[1]), return_state=True)
print("final state:", state.type.value, state.message, flush=True)
"""


def start_run(script: Path, config: dict, sleep_s: float, home: Path, log: Path):
    env = {**os.environ, "PREFECT_HOME": str(home), "PYTHONPATH": str(REPO),
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)  # the temporary server: the case that kept the slot
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, str(script), json.dumps(config), str(sleep_s)], cwd=REPO, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def wait_for(log: Path, text: str, process, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} in {log}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.mark.extended
@pytest.mark.slow
def test_a_killed_campaign_run_does_not_keep_the_slot_from_the_next(tmp_path):
    script = tmp_path / "campaign_run.py"
    script.write_text(CAMPAIGN_RUN)
    config = {
        "run_name": "slot", "storage_url": str(tmp_path / "store"), "rounds": 1,
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "env": {"train_tasks": 2, "test_tasks": 1},
    }  # fmt: skip
    home = tmp_path / "prefect"
    first = start_run(script, config, 600, home, tmp_path / "first.log")
    try:
        wait_for(tmp_path / "first.log", "holding campaign slot", first, 300)
        time.sleep(1)  # its record written
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    store = ArtifactStore(config["storage_url"])
    assert store.exists(store.url("slot", SLOT_HOLDER))  # the killed run's record is left

    second = start_run(script, config, 0, home, tmp_path / "second.log")
    try:
        second.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait()
    log = (tmp_path / "second.log").read_text()
    assert second.returncode == 0, log[-3000:]
    assert f"released the slot held by pid {first.pid}" in log, log[-3000:]
    assert "final state: COMPLETED campaign 'slot': published round 0" in log
    assert [r.round for r in load_campaign(store, "slot", "toy").rounds] == [0]
    assert not store.exists(store.url("slot", SLOT_HOLDER))  # given back with the slot
