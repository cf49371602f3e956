"""Stage: greedy episodes of a model on held-out tasks (the test split, or the validation split
while settings are chosen); success rate and reward. Its trajectories carry each task's outcome
(task id, success, reward), which the report pairs between stages."""

from __future__ import annotations

from pydantic import BaseModel

from envs.base import Environment
from envs.task_selection import task_list
from flywheel.inference import SamplingSettings
from flywheel.records import Message
from flywheel.settings import EnvSettings, InferenceSettings
from flywheel.stage import StageResult, StageRun, stage
from tasks.episodes import rollout_to_store


class EvaluateInputs(BaseModel):
    """One greedy episode of the model per test task."""

    model_url: str
    env: EnvSettings
    task_ids: list[str]  # the held-out tasks (`evaluation_splits`)
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


def evaluation_splits(
    env: Environment, env_settings: EnvSettings, seed: int
) -> dict[str, list[str]]:
    """The run's held-out task lists by split: "validation", the train tasks the run holds out
    (`env.validation_tasks`, when set), and "test", the test tasks it uses (`env.test_tasks`
    within `env.max_expert_steps`). Disjoint from each other and from the train tasks."""
    splits = {"test": task_list(env, "test", env_settings, seed)}
    validation = env.validation_ids()
    return {"validation": validation, **splits} if validation else splits
