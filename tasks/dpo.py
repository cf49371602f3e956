"""Stage: DPO on preference pairs (trl DPOTrainer in its own process), ETO's β and lr."""

from __future__ import annotations

from prefect import task

from flywheel.records import Manifest
from flywheel.settings import DPOSettings
from flywheel.stage import STAGE_CACHE, TrackingRef, store_for
from training.launch import trainer_stage


def dpo_trl_args(settings: DPOSettings, seed: int) -> dict:
    return {
        "beta": settings.beta,
        "learning_rate": settings.learning_rate,
        "num_train_epochs": settings.epochs,
        "gradient_accumulation_steps": settings.batch_size,
        "seed": seed,
        **settings.trl_args,
    }


@task(name="dpo", cache_policy=STAGE_CACHE, persist_result=True)
def dpo_stage(
    store_url: str,
    label: str,
    model_url: str,
    pairs_url: str,
    settings: DPOSettings,
    seed: int,
    out_url: str,
    tracking: TrackingRef | None = None,
) -> Manifest:
    return trainer_stage(
        "dpo", "training.dpo", store_for(store_url), label, model_url, pairs_url, out_url,
        settings, dpo_trl_args(settings, seed), tracking,
    )  # fmt: skip
