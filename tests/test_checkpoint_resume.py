"""A trainer killed with SIGKILL mid-training and run again ends where an uninterrupted run
ends: the same weights and the same per-step losses, bit for bit on a CPU (torchtune's test).
The re-run starts in a fresh work folder, as on another machine: all it has is the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from flywheel.settings import DPOSettings, SFTSettings
from flywheel.storage import ArtifactStore
from training.checkpoint import COMPLETE, CheckpointPlan
from training.job import TrainingJob

pytestmark = pytest.mark.slow


def trainer_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_RUN")}
    return {**env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def run_job(module: str, job: TrainingJob, folder: Path) -> subprocess.Popen:
    job_file = job.save(folder / "job.json")
    log = open(folder / "train.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [sys.executable, "-m", module, "--config", str(job_file)],
        stdout=log, stderr=subprocess.STDOUT, env=trainer_env(), start_new_session=True,
    )  # fmt: skip


def finish(process: subprocess.Popen, folder: Path) -> None:
    assert process.wait(timeout=600) == 0, (folder / "train.log").read_text()[-3000:]


def kill_after_first_checkpoint(process: subprocess.Popen, store: ArtifactStore, url: str) -> int:
    """SIGKILL the trainer as soon as a checkpoint is published; the step it had reached."""
    while process.poll() is None:
        records = [u for u in store.list_files(url) if u.endswith(COMPLETE)]
        if records:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return json.loads(store.read_text(records[0]))["step"]
        time.sleep(0.02)
    pytest.fail(f"the trainer ended (code {process.returncode}) before a checkpoint")


def killed_and_resumed(
    module, tmp_path, make_job, total_steps: int, interval: dict | None = None
) -> tuple[dict, dict]:
    """The job run through (no checkpoints) and the job killed after its first checkpoint and
    run again in a fresh work folder; each run's (weights, per-step history, metrics).
    `interval`: the plan's (every 2 steps unless given)."""
    store = ArtifactStore(str(tmp_path / "store"))
    plan = CheckpointPlan(
        store_url=store.root, url=store.url("stage/checkpoint"), key="k1",
        **(interval or {"every_steps": 2}),
    )  # fmt: skip
    runs = {}
    for name, checkpoint in (("through", None), ("killed", plan), ("resumed", plan)):
        folder = tmp_path / name
        folder.mkdir()
        job = make_job(folder, checkpoint)
        process = run_job(module, job, folder)
        if name == "killed":
            step = kill_after_first_checkpoint(process, store, plan.url)
            assert process.returncode == -signal.SIGKILL and 0 < step < total_steps
            continue
        finish(process, folder)
        metrics = json.loads((folder / "metrics.json").read_text())
        history = json.loads((folder / "history.json").read_text())
        runs[name] = (load_file(Path(job.output_dir) / "model.safetensors"), history, metrics)
    assert f"resuming from checkpoint {plan.url}" in (tmp_path / "resumed/train.log").read_text()
    return runs["through"], runs["resumed"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not (a[k].dtype == b[k].dtype and a[k].equal(b[k]))]
    assert not different, f"{len(different)} tensors differ, first {different[0]}"


@pytest.fixture
def expert_data(tmp_path):
    from agents.rollout import agent_prefix
    from envs import make_env
    from tasks.expert_data import collect_expert

    env = make_env("textcraft")
    trajectories, _ = collect_expert(env, env.task_ids("train")[:6], agent_prefix(env, []))
    path = tmp_path / "expert.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    return str(path)


# By time: due after every step (the Trainer's save_steps off, the callback asks for the saves).
@pytest.mark.parametrize(
    "interval", [{"every_steps": 2}, {"every_minutes": 1e-6}], ids=["by-steps", "by-time"]
)
def test_sft_killed_mid_training_resumes_to_the_uninterrupted_result(
    tmp_path, tiny_model_dir, expert_data, monkeypatch, interval
):
    # 6 trajectories, 1 per step, 2 epochs: 12 optimizer steps; a cosine schedule with warmup,
    # so that the scheduler's state matters.
    def make_job(folder: Path, checkpoint: CheckpointPlan | None) -> TrainingJob:
        monkeypatch.setenv("FLYWHEEL_METRICS_FILE", str(folder / "metrics.json"))
        return TrainingJob(
            model_dir=str(tiny_model_dir), data_file=expert_data, output_dir=str(folder / "model"),
            settings=SFTSettings(max_length=512), seed=3, checkpoint=checkpoint,
            history_file=str(folder / "history.json"),
            trl_args={
                "num_train_epochs": 2, "learning_rate": 1e-3, "lr_scheduler_type": "cosine",
                "warmup_steps": 0.2, "output_dir": str(folder / "work"),
                "report_to": "none", "disable_tqdm": True,
            },
        )  # fmt: skip

    through, resumed = killed_and_resumed(
        "training.sft", tmp_path, make_job, total_steps=12, interval=interval
    )
    assert_same_weights(through[0], resumed[0])

    def per_step(history: list[dict]) -> list[tuple]:
        return [(e["step"], e["loss"], e["grad_norm"], e["learning_rate"])
                for e in history if "loss" in e]  # fmt: skip

    assert per_step(through[1]) == per_step(resumed[1])
    assert len(per_step(through[1])) == 12 == through[2]["optimizer_steps"]
    assert through[2]["resumed_from_step"] == 0 < resumed[2]["resumed_from_step"]
    start = load_file(tiny_model_dir / "model.safetensors")
    assert any(not start[k].equal(through[0][k]) for k in start)  # training moved it


@pytest.mark.extended
def test_dpo_killed_mid_training_resumes_to_the_uninterrupted_result(
    tmp_path, tiny_model_dir, monkeypatch
):
    from test_dpo_entry import make_pair, write_pairs

    # 4 pairs, 1 per step, 2 epochs: 8 optimizer steps; the reference log-probabilities are
    # precomputed as the stage does (`tasks.dpo.dpo_trl_args`), so the resumed run computes them
    # again before its first step.
    pairs = [make_pair(chosen, rejected) for chosen, rejected in ((3, 2), (2, 4), (4, 1), (1, 3))]
    data = write_pairs(tmp_path / "pairs.jsonl", pairs)

    def make_job(folder: Path, checkpoint: CheckpointPlan | None) -> TrainingJob:
        monkeypatch.setenv("FLYWHEEL_METRICS_FILE", str(folder / "metrics.json"))
        return TrainingJob(
            model_dir=str(tiny_model_dir), data_file=data, output_dir=str(folder / "model"),
            settings=DPOSettings(max_length=512), seed=3, checkpoint=checkpoint,
            history_file=str(folder / "history.json"),
            trl_args={
                "num_train_epochs": 2, "learning_rate": 1e-3, "beta": 0.1,
                "lr_scheduler_type": "cosine", "warmup_steps": 0.2,
                "precompute_ref_log_probs": True, "output_dir": str(folder / "work"),
                "report_to": "none", "disable_tqdm": True,
            },
        )  # fmt: skip

    through, resumed = killed_and_resumed("training.dpo", tmp_path, make_job, total_steps=8)
    assert_same_weights(through[0], resumed[0])

    def per_step(history: list[dict]) -> list[tuple]:
        return [(e["step"], e["loss"], e["grad_norm"], e["learning_rate"],
                 e["rewards/chosen"], e["rewards/rejected"])
                for e in history if "loss" in e]  # fmt: skip

    assert per_step(through[1]) == per_step(resumed[1])
    assert len(per_step(through[1])) == 8 == through[2]["optimizer_steps"]
    assert through[2]["resumed_from_step"] == 0 < resumed[2]["resumed_from_step"]
    start = load_file(tiny_model_dir / "model.safetensors")
    assert any(not start[k].equal(through[0][k]) for k in start)  # training moved it


@pytest.mark.extended
def test_rl_killed_mid_training_resumes_to_the_uninterrupted_result(
    tmp_path, tiny_model_dir, chat, monkeypatch
):
    from test_rl import colour_group

    from flywheel.settings import RLSettings

    data = tmp_path / "group.jsonl"
    data.write_text("".join(t.model_dump_json() + "\n" for t in colour_group(chat) * 2))
    # 8 rows, 2 per step, 2 epochs: 8 steps; no KL term, so the first-visit log-probabilities
    # (state the loop keeps) matter; ppo would add the value head.
    settings = RLSettings(estimator="rloo", learning_rate=1e-3, epochs=2, batch_size=2,
                          kl_beta=0.0, max_length=512)  # fmt: skip

    def make_job(folder: Path, checkpoint: CheckpointPlan | None) -> TrainingJob:
        monkeypatch.setenv("FLYWHEEL_METRICS_FILE", str(folder / "metrics.json"))
        return TrainingJob(
            model_dir=str(tiny_model_dir), data_file=str(data), output_dir=str(folder / "model"),
            settings=settings, seed=5, checkpoint=checkpoint,
            history_file=str(folder / "history.json"),
        )  # fmt: skip

    through, resumed = killed_and_resumed("training.rl", tmp_path, make_job, total_steps=8)
    assert_same_weights(through[0], resumed[0])

    def per_step(history: list[dict]) -> list[tuple]:
        return [(e["step"], e["loss"], e["clip_ratio/region_mean"], e["grad_norm"])
                for e in history]  # fmt: skip

    assert per_step(through[1]) == per_step(resumed[1]) and len(through[1]) == 8
    for name in ("loss", "kl", "clip_fraction", "loss_tokens_trained", "optimizer_steps"):
        assert through[2][name] == resumed[2][name], name
    assert through[2]["resumed_from_step"] == 0 < resumed[2]["resumed_from_step"]


def test_rl_logs_every_optimizer_step_into_its_mlflow_run(tmp_path, tiny_model_dir, chat):
    """The curves trl's trainers give, in the stage's run while it trains: the run the stage
    hands the trainer (`Tracker.subprocess_env`)."""
    from test_rl import colour_job

    import training.rl as rl
    from flywheel.settings import RLSettings
    from flywheel.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "curves")
    run_id = tracker.start("rl/test")
    settings = RLSettings(estimator="grpo", learning_rate=1e-3, epochs=3, batch_size=4)
    job = colour_job(tmp_path, tiny_model_dir, chat, settings)
    with pytest.MonkeyPatch.context() as env:
        for name, value in tracker.subprocess_env(run_id).items():
            env.setenv(name, value)
        rl.train(job)
    client = tracker.client
    names = ("loss", "kl", "clip_ratio/region_mean", "grad_norm", "learning_rate", "reward",
             "reward_std", "advantages/mean", "advantages/std", "num_tokens",
             "tokens_per_second")  # fmt: skip
    for name in names:
        steps = [m.step for m in client.get_metric_history(run_id, name)]
        assert steps == [1, 2, 3], name
    rewards = [m.value for m in client.get_metric_history(run_id, "reward")]
    assert rewards == [0.5, 0.5, 0.5]  # the whole group each step: two of four rewarded
    tokens = [m.value for m in client.get_metric_history(run_id, "num_tokens")]
    assert tokens[1] == 2 * tokens[0] and tokens[2] == 3 * tokens[0]
    assert all(m.value == 1e-3 for m in client.get_metric_history(run_id, "learning_rate"))
