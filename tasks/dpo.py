"""Stage: DPO on preference pairs (trl DPOTrainer in its own process), ETO's β and lr."""

from __future__ import annotations

from flywheel.records import Manifest
from flywheel.settings import DPOSettings
from flywheel.stage import TrackingRef, stage_task, store_for
from training.launch import trainer_stage


def dpo_trl_args(settings: DPOSettings, seed: int) -> dict:
    return {
        "beta": settings.beta,
        "learning_rate": settings.learning_rate,
        "num_train_epochs": settings.epochs,
        "gradient_accumulation_steps": settings.accumulation_steps,
        "seed": seed,
        # The reference model's log-probabilities, once per round before the first step instead
        # of a reference forward every step: same losses, 1.2-1.4x the trained tokens/s on 2
        # cores (bench/results-train-throughput.md).
        "precompute_ref_log_probs": True,
        **settings.trl_args,
    }


@stage_task("dpo")
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
