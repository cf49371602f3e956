"""The GPU checklist's dry mode (CI, no GPU): every command built, every config parsed, the
predictions computed, nothing launched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gpu_checklist  # noqa: E402


def test_dry_run_plans_every_step_and_launches_nothing(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: launched.append(a))
    out = tmp_path / "checklist.md"
    assert gpu_checklist.main(["--dry-run", "--work", str(tmp_path), "--out", str(out)]) == 0
    assert launched == []
    text = out.read_text()
    names = ["bandwidth", "build-model", "rollout", "sft", "dpo", "sft-lora", "dpo-lora",
             "zero2", "zero3", "rl", "eto-round"]  # fmt: skip
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")]
    assert rows[1:] == names  # in order, after the header row
    assert "configs/accelerate/zero3.yaml (zero_stage 3)" in text
    assert "configs/agent_r1_qa.yaml + 6 overrides (rl)" in text
    # The model's config is the one the sizing predicts for: 1.71B parameters.
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    shape = gpu_checklist.MODEL_SHAPE
    assert (config["hidden_size"], config["num_hidden_layers"]) == (shape.hidden, shape.layers)
    assert "1.71B parameters" in text


def test_rollout_prediction_is_the_sizing_decode_bound(tmp_path):
    from sizing import H100, decode_bound

    steps = gpu_checklist.plan(tmp_path, tmp_path / "model", 1, H100)
    rollout = next(s for s in steps if s.name == "rollout")
    bound = decode_bound(gpu_checklist.MODEL_SHAPE, H100, 64, 1000)
    assert f"decode bound {bound:,.0f} generated tok/s" in rollout.predicted


def test_a_failing_step_does_not_stop_the_next(tmp_path):
    failing = gpu_checklist.Step("fails", [sys.executable, "-c", "raise SystemExit(3)"], 30)
    slow = gpu_checklist.Step("slow", [sys.executable, "-c", "import time; time.sleep(5)"], 1)
    fine = gpu_checklist.Step("fine", [sys.executable, "-c", "print('done 42')"], 30)
    for step in (failing, slow, fine):
        gpu_checklist.run_step(step, tmp_path)
    assert failing.status.startswith("failed (exit 3")
    assert slow.status.startswith("timed out after 1 s")
    assert (fine.status, fine.measured) == ("ok", "done 42")
