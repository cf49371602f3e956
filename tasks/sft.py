"""Stage: supervised fine-tuning on trajectories (trl SFTTrainer in its own process)."""

from __future__ import annotations

from flywheel.records import Manifest
from flywheel.settings import SFTSettings
from flywheel.stage import TrackingRef, stage_task, store_for
from training.launch import trainer_stage


def sft_trl_args(settings: SFTSettings, seed: int) -> dict:
    return {
        "num_train_epochs": settings.epochs,
        "learning_rate": settings.learning_rate,
        "gradient_accumulation_steps": settings.accumulation_steps,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 0.05,  # a fraction of all steps
        "seed": seed,
        **settings.trl_args,
    }


@stage_task("sft")
def sft_stage(
    store_url: str,
    label: str,
    model_url: str,
    data_url: str,
    settings: SFTSettings,
    seed: int,
    out_url: str,
    tracking: TrackingRef | None = None,
) -> Manifest:
    return trainer_stage(
        "sft", "training.sft", store_for(store_url), label, model_url, data_url, out_url,
        settings, sft_trl_args(settings, seed), tracking,
    )  # fmt: skip
