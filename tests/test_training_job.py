"""The job file a stage hands its trainer process: the stage's settings whole, written as JSON and
validated again in the trainer (a bad file names the field); the trl arguments it yields are
the ones the settings say; and every trainer setting has one key, never a second one through
`trl_args`."""

from __future__ import annotations

import json
import os

import pytest

from flows.eto import ETOConfig
from flywheel.config_files import ConfigError, load_config
from flywheel.settings import DPOSettings, LoRASettings, RLSettings, SFTSettings
from tasks.dpo import dpo_trl_args
from tasks.sft import sft_trl_args
from training.checkpoint import CheckpointPlan
from training.job import JobFileError, TrainingJob, parse_job, trainer_defaults

PLAN = CheckpointPlan(store_url="file:///s", url="file:///s/dpo/checkpoint", key="k", every_steps=5)


def dpo_job(tmp_path, settings: DPOSettings, seed: int = 7) -> TrainingJob:
    return TrainingJob(
        model_dir="m", data_file="pairs.jsonl", output_dir=str(tmp_path / "model"),
        settings=settings, seed=seed, trl_args=dpo_trl_args(settings), checkpoint=PLAN,
    )  # fmt: skip


@pytest.mark.parametrize(
    "settings",
    [SFTSettings(frozen_layers=3, max_length=512, trl_args={"lr_scheduler_type": "constant"}),
     DPOSettings(beta=0.3, lora=LoRASettings(enabled=True, rank=4, top_layers=1)),
     RLSettings(estimator="ppo", clip_high=0.28, groups="mixed")],
    ids=["sft", "dpo", "rl"],
)  # fmt: skip
def test_a_job_reads_back_as_written_with_its_settings_typed(tmp_path, settings):
    job = TrainingJob(model_dir="m", data_file="d", output_dir="o", settings=settings, seed=4,
                      checkpoint=PLAN, history_file="h.json")  # fmt: skip
    path = job.save(tmp_path / "job.json")
    read = parse_job("trainer", type(settings), ["--config", str(path)])
    assert type(read.settings) is type(settings) and read.settings == settings
    assert read.model_dump() == job.model_dump()
    assert read.checkpoint == PLAN and read.seed == 4


def test_a_bad_job_file_is_refused_naming_each_field(tmp_path):
    written = json.loads(dpo_job(tmp_path, DPOSettings()).model_dump_json())
    written["settings"]["beta"] = -1
    written["settings"]["betta"] = 0.2
    del written["seed"]
    path = tmp_path / "job.json"
    path.write_text(json.dumps(written))
    with pytest.raises(JobFileError) as error:
        TrainingJob[DPOSettings].load(str(path))
    message = str(error.value)
    assert message == (
        f"job file {path} does not fit TrainingJob[DPOSettings]: "
        "settings.beta: Input should be greater than 0; "
        "settings.betta: Extra inputs are not permitted; seed: Field required"
    )


def test_another_trainers_job_is_refused(tmp_path):
    """A DPO job handed to the RL trainer fails on its first foreign setting, not mid-run."""
    path = dpo_job(tmp_path, DPOSettings()).save(tmp_path / "job.json")
    with pytest.raises(JobFileError, match="settings.beta: Extra inputs are not permitted"):
        TrainingJob[RLSettings].load(str(path))


def test_the_settings_give_trl_the_same_arguments_as_before_the_job_was_typed(tmp_path):
    """What trl's DPOConfig is built from (CPU): the settings' own arguments, the run's seed and
    the shared defaults, as the untyped job gave them."""
    job = dpo_job(
        tmp_path, DPOSettings(beta=0.3, batch_size=4, num_processes=2, learning_rate=2e-6)
    )
    args = trainer_defaults(job)
    assert {k: args[k] for k in ("beta", "learning_rate", "num_train_epochs",
                                 "gradient_accumulation_steps", "seed",
                                 "precompute_ref_log_probs")} == {
        "beta": 0.3, "learning_rate": 2e-6, "num_train_epochs": 3.0,
        "gradient_accumulation_steps": 2, "seed": 7, "precompute_ref_log_probs": True,
    }  # fmt: skip
    assert (args["save_strategy"], args["save_steps"]) == ("steps", 5)
    sft = SFTSettings(epochs=2, trl_args={"lr_scheduler_type": "constant"})
    sft_job = TrainingJob(model_dir="m", data_file="d", output_dir="o", settings=sft, seed=3,
                          trl_args=sft_trl_args(sft))  # fmt: skip
    sft_args = trainer_defaults(sft_job)
    assert (sft_args["seed"], sft_args["lr_scheduler_type"], sft_args["num_train_epochs"]) == (
        3, "constant", 2.0
    )  # fmt: skip
    assert sft_args["save_strategy"] == "no"  # no plan: no checkpoints


def test_dpo_beta_has_one_key_per_round_and_trl_args_may_not_set_it():
    """`dpo.beta` is every round's beta; a `dpo.schedule` entry's `beta` is its rounds' (entry
    r-1 for round r, the last for later rounds); `trl_args.beta`, at either place, is refused
    naming the key to set, since the stages pass trl_args last and it would silently win."""
    every_round = load_config(ETOConfig, None, ["dpo.beta=0.3"]).dpo
    assert [dpo_trl_args(every_round.for_round(r))["beta"] for r in (1, 2)] == [0.3, 0.3]
    scheduled = load_config(ETOConfig, None, ["dpo.beta=0.3", "dpo.schedule=[{}, {beta: 0.5}]"])
    assert [dpo_trl_args(scheduled.dpo.for_round(r))["beta"] for r in (1, 2, 3)] == [0.3, 0.5, 0.5]
    with pytest.raises(
        ConfigError, match=r"dpo: .*trl_args\.beta repeats the setting beta: set beta"
    ):
        load_config(ETOConfig, None, ["dpo.trl_args={beta: 0.5}"])
    with pytest.raises(
        ConfigError, match=r"schedule entry 1 \(round 2\): .*trl_args\.beta .*set beta"
    ):
        load_config(ETOConfig, None, ["dpo.schedule=[{}, {trl_args: {beta: 0.5}}]"])


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_deterministic_job_turns_on_torchs_strict_deterministic_kernels(
    tmp_path, monkeypatch, deterministic
):
    import torch

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so undone after the test
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    settings = SFTSettings(deterministic=deterministic)
    job = TrainingJob(model_dir="m", data_file="d", output_dir="o", settings=settings, seed=4)
    path = job.save(tmp_path / "job.json")
    before = torch.are_deterministic_algorithms_enabled()
    try:
        parse_job("trainer", SFTSettings, ["--config", str(path)])
        assert torch.are_deterministic_algorithms_enabled() is deterministic
        # strict: an op without a deterministic kernel raises rather than warns
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        pinned = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        assert pinned == (":4096:8" if deterministic else None)
    finally:
        torch.use_deterministic_algorithms(before)
