"""Stage: DPO on preference pairs (trl DPOTrainer in its own process), ETO's β and lr."""

from __future__ import annotations

from pydantic import BaseModel

from flywheel.settings import DPOSettings
from flywheel.stage import StageResult, StageRun, stage
from training.launch import trained_model


def dpo_trl_args(settings: DPOSettings) -> dict:
    """trl's DPOConfig arguments from the round's settings (the seed is the job's own field)."""
    return {
        "beta": settings.beta,
        "learning_rate": settings.learning_rate,
        "num_train_epochs": settings.epochs,
        "gradient_accumulation_steps": settings.accumulation_steps,
        # The reference model's log-probabilities, once per round before the first step instead
        # of a reference forward every step: same losses, 1.2-1.4x the trained tokens/s on 2
        # cores (bench/results-train-throughput.md).
        "precompute_ref_log_probs": True,
        **settings.trl_args,
    }


class DPOInputs(BaseModel):
    """The policy to improve (also DPO's reference model) and its preference pairs."""

    model_url: str
    pairs_url: str  # `Pair` records: chosen and rejected continuations of one prompt
    settings: DPOSettings  # the round's: `DPOSettings.for_round`
    seed: int


@stage("dpo", launches=("training.dpo",))
def dpo_stage(inputs: DPOInputs, run: StageRun) -> StageResult:
    """The DPO'd policy in `model/`, trl's log in `train.log`, its last metrics."""
    return trained_model(
        run, "training.dpo", inputs.model_url, inputs.pairs_url, inputs.settings, inputs.seed,
        dpo_trl_args(inputs.settings),
    )  # fmt: skip
