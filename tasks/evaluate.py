"""Stage: greedy episodes of a model on the held-out test tasks; success rate and reward."""

from __future__ import annotations

from pydantic import BaseModel

from agents.rollout import rollout_to_store
from flywheel.inference import SamplingSettings
from flywheel.records import Message
from flywheel.settings import EnvSettings, InferenceSettings
from flywheel.stage import StageResult, StageRun, stage


class EvaluateInputs(BaseModel):
    """One greedy episode of the model per test task."""

    model_url: str
    env: EnvSettings
    task_ids: list[str]  # the held-out test tasks
    prefix: list[Message]  # prompted as the model was trained (the untrained: with examples)
    inference: InferenceSettings
    max_steps: int


@stage("evaluate")
def evaluate_stage(inputs: EvaluateInputs, run: StageRun) -> StageResult:
    sampling = SamplingSettings(temperature=0.0, max_tokens=inputs.inference.max_tokens)
    return rollout_to_store(
        run.store, "evaluate", inputs.model_url, inputs.env, inputs.task_ids, inputs.prefix,
        inputs.inference, inputs.max_steps, sampling, run.file("trajectories.jsonl"),
    )  # fmt: skip
