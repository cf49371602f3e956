"""Stage: supervised fine-tuning on trajectories (trl SFTTrainer in its own process)."""

from __future__ import annotations

from pydantic import BaseModel

from flywheel.settings import SFTSettings
from flywheel.stage import StageResult, StageRun, stage
from training.launch import trained_model


def sft_trl_args(settings: SFTSettings) -> dict:
    """trl's SFTConfig arguments from the settings (the run's seed is the job's own field)."""
    return {
        "num_train_epochs": settings.epochs,
        "learning_rate": settings.learning_rate,
        "gradient_accumulation_steps": settings.accumulation_steps,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 0.05,  # a fraction of all steps
        **settings.trl_args,
    }


class SFTInputs(BaseModel):
    """The model to start from and the trajectories to fine-tune it on."""

    model_url: str
    data_url: str  # trajectories; turns flagged `loss` are trained on
    settings: SFTSettings
    seed: int


@stage("sft", launches=("training.sft",))
def sft_stage(inputs: SFTInputs, run: StageRun) -> StageResult:
    """The fine-tuned model in `model/`, trl's log in `train.log`, its last metrics."""
    return trained_model(
        run, "training.sft", inputs.model_url, inputs.data_url, inputs.settings, inputs.seed,
        sft_trl_args(inputs.settings),
    )  # fmt: skip
