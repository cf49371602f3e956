"""Stage: reinforcement learning on sampled trajectories (`training.rl` in its own process)."""

from __future__ import annotations

from pydantic import BaseModel

from flywheel.settings import RLSettings
from flywheel.stage import StageResult, StageRun, stage
from training.launch import trained_model


class RLInputs(BaseModel):
    """The policy the trajectories were sampled from (also the KL reference) and those
    trajectories, with group ids, rewards, token ids and, where recorded, log-probabilities."""

    model_url: str
    data_url: str  # `Trajectory` records
    settings: RLSettings
    seed: int


@stage("rl", launches=("training.rl",))
def rl_stage(inputs: RLInputs, run: StageRun) -> StageResult:
    """The updated policy in `model/`, the trainer's log in `train.log`, its last metrics."""
    return trained_model(
        run, "training.rl", inputs.model_url, inputs.data_url, inputs.settings, inputs.seed,
        trl_args={},
    )  # fmt: skip
