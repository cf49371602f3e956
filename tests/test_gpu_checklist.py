"""The GPU checklist's dry mode (CI, no GPU): every command built, every config parsed, the
predictions computed, nothing launched."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import gpu_checklist

# Round 0 of each configs/gpu/ file, on the checklist's model (the GPU machine reaches no Hub).
SHIPPED_GPU_CONFIGS = [
    "config-agent_r1_qa_qwen1.5b", "config-eto_textcraft_qwen1.5b",
    "config-eto_textcraft_qwen7b_8gpu", "config-eto_textcraft_qwen7b_lora",
]  # fmt: skip


def test_dry_run_plans_every_step_and_launches_nothing(tmp_path, monkeypatch):
    # Imported before `run` is replaced: the recipes' configs reach MLflow, which asks git for
    # its version through subprocess.run, and vLLM, which checks configs/gpu's vllm_args.
    import vllm.engine.arg_utils  # noqa: F401

    import flows.agent_r1
    import flows.eto  # noqa: F401

    launched = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: launched.append(a))
    out = tmp_path / "checklist.md"
    assert gpu_checklist.main(["--dry-run", "--work", str(tmp_path), "--out", str(out)]) == 0
    assert launched == []
    text = out.read_text()
    names = ["bandwidth", "build-model", "rollout", "sft", "dpo", "sft-lora", "dpo-lora",
             "zero2", "zero3", "rl", *SHIPPED_GPU_CONFIGS, "eto-round"]  # fmt: skip
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")]
    assert rows[1:] == names  # in order, after the header row
    assert "configs/accelerate/zero3.yaml (zero_stage 3)" in text
    assert "configs/agent_r1_qa.yaml + 6 overrides (rl)" in text
    # Every shipped GPU config parses with the checklist's overrides before any step launches.
    assert "configs/gpu/eto_textcraft_qwen7b_8gpu.yaml + 6 overrides" in text
    # The model's config is the one the sizing predicts for: 1.71B parameters.
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    shape = gpu_checklist.MODEL_SHAPE
    assert (config["hidden_size"], config["num_hidden_layers"]) == (shape.hidden, shape.layers)
    assert "1.71B parameters" in text


def test_rollout_prediction_is_the_sizing_decode_bound(tmp_path):
    from bench.sizing import H100, decode_bound

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


def test_a_machine_without_the_flows_runs_the_prepared_jobs_and_names_what_is_missing(
    tmp_path, monkeypatch
):
    """--from-prepared (a lent GPU machine: torch and the trainers, no vLLM or Prefect): every
    prepared job becomes a train step, and a step whose package is missing is skipped naming it."""
    prepared = tmp_path / "prepared"
    (prepared / "jobs").mkdir(parents=True)
    jobs = {"sft": {"trainer": "sft", "accelerate": None}, "sft-packed": {"trainer": "sft",
            "accelerate": None}, "zero3": {"trainer": "sft", "accelerate": "zero3"}}  # fmt: skip
    (prepared / "plan.json").write_text(json.dumps(jobs))
    missing = {"vllm", "prefect", "deepspeed"}
    monkeypatch.setattr(gpu_checklist.importlib.util, "find_spec",
                        lambda name: None if name in missing else object())  # fmt: skip
    monkeypatch.setattr(gpu_checklist, "gpu_count", lambda: 1)
    ran = []

    def run_step(step, work):
        ran.append(step)
        step.status = f"skipped: {step.skip}" if step.skip else "ok"

    monkeypatch.setattr(gpu_checklist, "run_step", run_step)
    out = tmp_path / "report.md"
    gpu_checklist.run_prepared(prepared, tmp_path / "work", out)
    status = {s.name: s.status for s in ran}
    assert list(status) == ["bandwidth", "build-model", "rollout", "sft", "zero3", "rl",
                            *SHIPPED_GPU_CONFIGS, "eto-round", "sft-packed", "profile-sft"]  # fmt: skip
    assert status["rollout"] == "skipped: vllm is not installed on this machine"
    assert (
        status["rl"] == status["eto-round"] == "skipped: prefect is not installed on this machine"
    )
    assert status["zero3"] == "skipped: deepspeed is not installed on this machine"
    assert status["sft"] == status["sft-packed"] == "ok"
    sft = next(s for s in ran if s.name == "sft")
    assert sft.command[-4:] == ["train", str(prepared), "sft", str(tmp_path / "work")]
    assert "| sft-packed | ok |" in out.read_text()
    profile = next(s for s in ran if s.name == "profile-sft")
    assert profile.status == "ok"
    assert profile.command[1:5] == ["-m", "bench.profile_train_step", str(prepared), "sft"]


def test_the_repeat_step_runs_only_when_named_on_the_prepared_jobs_it_can_repeat(
    tmp_path, monkeypatch
):
    prepared = tmp_path / "prepared"
    (prepared / "jobs").mkdir(parents=True)
    names = ("sft", "dpo", "zero2", "sft-lora", "rl-step-lora")
    jobs = {name: {"trainer": "sft", "accelerate": None} for name in names}
    (prepared / "plan.json").write_text(json.dumps(jobs))
    monkeypatch.setattr(gpu_checklist, "gpu_count", lambda: 1)
    ran = []

    def run_step(step, work):
        ran.append(step)
        step.status = "ok"

    monkeypatch.setattr(gpu_checklist, "run_step", run_step)
    work = tmp_path / "work"
    gpu_checklist.run_prepared(prepared, work, tmp_path / "a.md", ["build-model", "repeat"])
    assert [s.name for s in ran] == ["bandwidth", "build-model", "repeat"]
    repeat = ran[-1]
    assert repeat.command[1:4] == ["-m", "bench.train_repeat", str(prepared)]
    jobs_named = repeat.command[repeat.command.index("--jobs") + 1 : -2]
    assert jobs_named == ["sft", "sft-lora", "rl-step-lora"]  # those it repeats, prepared
    assert repeat.command[repeat.command.index("--modes") + 1] == "setting"
    assert repeat.timeout_s == gpu_checklist.REPEAT_TIMEOUT_S > gpu_checklist.PREPARED_TIMEOUT_S
    ran.clear()
    gpu_checklist.run_prepared(prepared, work, tmp_path / "b.md", ["sft"])
    assert [s.name for s in ran] == ["bandwidth", "sft"]


@pytest.mark.extended
@pytest.mark.slow  # 77 s on 2 cores: the expert data, the built-in tokenizer, a trainer
def test_a_prepared_job_trains_and_reports_its_tokens_per_second(tmp_path):
    """--prepare here, then one prepared job run as the GPU machine runs it (a 2-layer model of
    the same vocabulary, on this CPU): the job's folders are filled in and its rate printed."""
    import os

    env = os.environ | {"FLYWHEEL_CHECKLIST_TINY": "1"}
    root = gpu_checklist.ROOT  # as the GPU machine runs it: from the repository, not installed
    script = [sys.executable, "-m", "bench.gpu_checklist"]
    prepared, work = tmp_path / "prepared", tmp_path / "work"
    subprocess.run([*script, "--prepare", str(prepared), "--tasks", "2", "--pairs", "1",
                    "--jobs", "sft"], env=env, cwd=root, check=True)  # fmt: skip
    assert "@WORK@/model" in (prepared / "jobs" / "sft.json").read_text()
    subprocess.run([*script, "--internal", "build-model", str(work / "model"),
                    str(prepared / "tokenizer")], env=env, cwd=root, check=True)  # fmt: skip
    done = subprocess.run([*script, "--internal", "train", str(prepared), "sft", str(work)],
                          env=env, cwd=root, check=True, capture_output=True,
                          text=True)  # fmt: skip
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    planned = json.loads((prepared / "plan.json").read_text())["sft"]
    assert measured["rows"] == planned["rows"] == 2
    assert measured["trained_tokens_per_s"] == round(
        planned["real_tokens"] / measured["train_s"], 1
    )
    assert (work / "sft" / "model" / "config.json").exists()
    # The step profiler on the same prepared job: every optimizer step timed, one profiled.
    profile = tmp_path / "profile.md"
    subprocess.run([sys.executable, "-m", "bench.profile_train_step", str(prepared), "sft",
                    "--work", str(work), "--warmup", "0", "--active", "1", "--out", str(profile)],
                   env=env, cwd=root, check=True)  # fmt: skip
    text = profile.read_text()
    assert f"{measured['optimizer_steps']} optimizer steps" in text
    assert "## by host time" in text and "aten::mm" in text


@pytest.mark.extended
@pytest.mark.slow  # the expert data, the built-in tokenizer, the RL trainer on a 2-layer model
def test_a_prepared_rl_step_trains_groups_with_signal_and_reports_its_rate(tmp_path):
    """The RL step the GPU checklist prepares: each expert trajectory as a group of RL_GROUP
    samples with rewards 1, 0, 1, 0, trained by training.rl as Agent-R1's stage launches it; the
    trainer reports its update time as trl's trainers do, so the rate is the same measure."""
    import os

    env = os.environ | {"FLYWHEEL_CHECKLIST_TINY": "1"}
    root, script = gpu_checklist.ROOT, [sys.executable, "-m", "bench.gpu_checklist"]
    prepared, work = tmp_path / "prepared", tmp_path / "work"
    subprocess.run([*script, "--prepare", str(prepared), "--tasks", "4", "--pairs", "1",
                    "--jobs", "rl-step"], env=env, cwd=root, check=True)  # fmt: skip
    rows = [json.loads(line) for line in (prepared / "rl.jsonl").read_text().splitlines()]
    assert [(r["group_id"], r["reward"]) for r in rows] == [
        ("g0", 1.0),
        ("g0", 0.0),
        ("g0", 1.0),
        ("g0", 0.0),
    ]
    subprocess.run([*script, "--internal", "build-model", str(work / "model"),
                    str(prepared / "tokenizer")], env=env, cwd=root, check=True)  # fmt: skip
    done = subprocess.run([*script, "--internal", "train", str(prepared), "rl-step", str(work)],
                          env=env, cwd=root, check=True, capture_output=True,
                          text=True)  # fmt: skip
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["rows"] == 4 and measured["optimizer_steps"] >= 1
    assert measured["train_s"] > 0
    metrics = json.loads((work / "rl-step" / "metrics.json").read_text())
    assert metrics["rows_skipped_zero_advantage"] == 0  # every row carried a signal
    assert (work / "rl-step" / "model" / "config.json").exists()
