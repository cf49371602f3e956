"""The Retry case, through Prefect: a flow run fails for one setting, a later run of the same run
name publishes with another, then the first flow run is retried (`prefect flow-run retry`, what
the UI's Retry button does). The retry re-runs its own key and fails again; the newer result is
not destroyed, and the next run with its setting is served it from the store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FLOW = """
import sys
from prefect import flow
from pydantic import BaseModel

import flows  # noqa: F401  (the project's Prefect settings)
from flywheel.stage import StageOutput, StageResult, StageRun, stage

STORE = {store!r}
BODIES = {bodies!r}  # one line each time the stage's body runs


class TrainInputs(BaseModel):
    max_length: int


@stage("dpo")
def dpo_stage(inputs: TrainInputs, run: StageRun) -> StageResult:
    with open(BODIES, "a") as log:
        log.write(f"{{inputs.max_length}}\\n")
    url = run.store.write_text(run.file("model/weights.txt"), f"trained at {{inputs.max_length}}")
    if inputs.max_length < 100:
        raise ValueError("no pair fits in max_length=64 -> raise dpo.max_length")
    return StageResult(files={{"model": url}})


@flow(name="dpo-run")
def dpo_run(max_length: int):
    dpo_stage(TrainInputs(max_length=max_length), StageOutput(store_url=STORE, url=STORE + "/run/dpo"))


if __name__ == "__main__":
    state = dpo_run(int(sys.argv[1]), return_state=True)
    print("FLOW_RUN", state.state_details.flow_run_id, state.type.value, flush=True)
"""


def run(args: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


def test_retrying_an_old_failed_flow_run_keeps_the_newer_result(tmp_path):
    store = tmp_path / "store"
    flow_file = tmp_path / "dpo_flow.py"
    bodies = tmp_path / "bodies.log"
    flow_file.write_text(FLOW.format(store=f"file://{store}", bodies=str(bodies)))

    failed = run([sys.executable, str(flow_file), "64"], tmp_path)
    match = re.search(r"FLOW_RUN (\S+) FAILED", failed)
    assert match, failed[-3000:]
    published = run([sys.executable, str(flow_file), "1024"], tmp_path)
    assert "COMPLETED" in published, published[-3000:]

    prefect = str(Path(sys.executable).parent / "prefect")
    retried = run([prefect, "flow-run", "retry", match.group(1), "--entrypoint",
                   f"{flow_file}:dpo_run"], tmp_path)  # fmt: skip
    assert "max_length=64" in retried, retried[-3000:]  # it re-ran its own setting, and failed
    assert bodies.read_text().split() == ["64", "1024", "64"]

    served = run([sys.executable, str(flow_file), "1024"], tmp_path)
    assert "COMPLETED" in served, served[-3000:]
    assert bodies.read_text().split() == ["64", "1024", "64"]  # not trained
    weights = store / "run" / "dpo" / "model" / "weights.txt"
    assert weights.read_text() == "trained at 1024"
    manifest = json.loads((store / "run" / "dpo" / "_MANIFEST.json").read_text())
    assert manifest["key_inputs"]["max_length"] == 1024
