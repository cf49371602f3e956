"""Stage: a model's episodes on held-out tasks (the test split, or the validation split while
settings are chosen): greedy, one per task, or `samples_per_task` sampled ones; success rate and
reward. Its trajectories carry each task's outcome (task id, success, reward), which the report
pairs between stages.

Beside the greedy evaluation of the split's tasks, a run can ask for variants
(`EvaluateSettings.variants`): "sampled" (k seeded samples per task), "harder" (the test tasks
beyond the trained difficulty) and "harder-sampled". A variant's evaluation of stage `sft` is
labelled `sft@sampled` (`variant_label`), and the report gives each variant a table of its own."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from envs.base import Environment
from envs.task_selection import task_list
from flywheel.config_files import ConfigError
from flywheel.inference import SamplingSettings
from flywheel.records import Message
from flywheel.settings import EnvSettings, EvaluateSettings, InferenceSettings
from flywheel.stage import StageResult, StageRun, stage
from tasks.episodes import rollout_to_store

VARIANT_MARK = "@"  # `sft@sampled`: the "sampled" variant's evaluation of stage `sft`


class EvaluateInputs(BaseModel):
    """A model's episodes on held-out tasks: one greedy episode per task, or
    `samples_per_task` sampled ones (seeded by `seed`, the task and the sample's index)."""

    model_url: str
    env: EnvSettings
    task_ids: list[str]  # the held-out tasks (`evaluation_splits`)
    prefix: list[Message]  # prompted as the model was trained (the untrained: with examples)
    inference: InferenceSettings
    max_steps: int
    samples_per_task: int = Field(default=1, ge=1)
    temperature: float = Field(default=0.0, ge=0)  # 0: greedy
    seed: int = 0

    @model_validator(mode="after")
    def _samples_are_sampled(self):
        if self.samples_per_task > 1 and self.temperature == 0:
            raise ValueError("several episodes per task need temperature > 0: greedy ones repeat")
        return self


@stage("evaluate")
def evaluate_stage(inputs: EvaluateInputs, run: StageRun) -> StageResult:
    sampling = SamplingSettings(
        temperature=inputs.temperature, max_tokens=inputs.inference.max_tokens, seed=inputs.seed
    )
    return rollout_to_store(
        run.store, "evaluate", inputs.model_url, inputs.env, inputs.task_ids, inputs.prefix,
        inputs.inference, inputs.max_steps, sampling, run.file("trajectories.jsonl"),
        samples_per_task=inputs.samples_per_task,
    )  # fmt: skip


def evaluation_splits(
    env: Environment, env_settings: EnvSettings, seed: int
) -> dict[str, list[str]]:
    """The run's held-out task lists by split: "validation", the train tasks the run holds out
    (`env.validation_tasks`, when set), and "test", the test tasks it uses (`env.test_tasks`
    within `env.max_expert_steps`, sampled with `seed`: runs pass `ops.driver.HELD_OUT_SEED`,
    one for every run seed, so seeds pair task by task). Disjoint from each other and from the
    train tasks."""
    splits = {"test": task_list(env, "test", env_settings, seed)}
    validation = env.validation_ids()
    return {"validation": validation, **splits} if validation else splits


def harder_tasks(env: Environment, env_settings: EnvSettings, longest: int) -> list[str]:
    """The test tasks whose expert plan is longer than `env.max_expert_steps` and at most
    `longest` steps: goals harder than any the run trained on."""
    trained = env_settings.max_expert_steps or 0
    harder = [t for t in env.task_ids("test") if trained < len(env.expert_plan(t) or ()) <= longest]
    if not harder:
        raise ConfigError(
            f"evaluate.harder_max_expert_steps={longest}: no test task of {env.name} has an "
            f"expert plan of {trained + 1} to {longest} steps; raise it, or leave it unset"
        )
    return harder


def variant_label(label: str, variant: str) -> str:
    return f"{label}{VARIANT_MARK}{variant}" if variant else label


def label_variant(label: str) -> tuple[str, str]:
    """(stage, variant) of an evaluation's label: `sft@sampled` -> ("sft", "sampled"),
    `sft` -> ("sft", "")."""
    stage_label, _, variant = label.partition(VARIANT_MARK)
    return stage_label, variant


def variant_inputs(
    inputs: EvaluateInputs,
    variant: str,
    settings: EvaluateSettings,
    harder: list[str] | None,
    seed: int,
) -> EvaluateInputs:
    """The greedy evaluation's inputs turned into `variant`'s: the harder tasks for "harder*",
    `settings.samples` samples per task for "*sampled", seeded by the run's `seed` (a greedy
    evaluation keeps seed 0: its episodes do not depend on it, so seeds share its cache). The
    harder goals' step budget is not set here but by the driver that sets the greedy one
    (`ops.driver.harder_step_budget`): a change to this module would re-key every evaluation."""
    update: dict = {}
    if variant.startswith("harder"):
        update["task_ids"] = harder
    if variant.endswith("sampled"):
        update.update(
            samples_per_task=settings.samples, temperature=settings.temperature, seed=seed
        )
    return inputs.model_copy(update=update)
