"""Stage: episodes of the policy on train tasks: one shard of ETO's exploration (mapped over
shards by the flow), or Agent-R1's groups of samples per question."""

from __future__ import annotations

from pydantic import BaseModel

from flywheel.inference import SamplingSettings
from flywheel.records import Message
from flywheel.settings import EnvSettings, InferenceSettings
from flywheel.stage import StageResult, StageRun, stage
from tasks.episodes import rollout_to_store


def shard(task_ids: list[str], shards: int, samples_per_task: int) -> list[list[str]]:
    """Split the (repeated) task list into at most `shards` non-empty, balanced parts."""
    work = [t for t in task_ids for _ in range(samples_per_task)]
    parts = [work[i::shards] for i in range(shards)]
    return [p for p in parts if p]


class ExploreInputs(BaseModel):
    """One shard of the policy's episodes on train tasks (a task repeated per sample)."""

    model_url: str
    env: EnvSettings
    task_ids: list[str]  # this shard's (`shard`)
    prefix: list[Message]
    inference: InferenceSettings
    temperature: float  # ETO explores greedily: 0
    max_steps: int
    seed: int  # per round and shard, so shards sample differently
    # Episodes per task, played together as one group (a GRPO group: `Trajectory.group_id`).
    samples_per_task: int = 1
    logprobs: bool = False  # record the sampler's log-probability of each generated token


def play_and_store(inputs: ExploreInputs, run: StageRun) -> StageResult:
    sampling = SamplingSettings(
        temperature=inputs.temperature, max_tokens=inputs.inference.max_tokens, seed=inputs.seed,
        logprobs=inputs.logprobs,
    )  # fmt: skip
    return rollout_to_store(
        run.store, run.name, inputs.model_url, inputs.env, inputs.task_ids, inputs.prefix,
        inputs.inference, inputs.max_steps, sampling, run.file("trajectories.jsonl"),
        samples_per_task=inputs.samples_per_task,
    )  # fmt: skip


@stage("explore-shard")
def explore_stage(inputs: ExploreInputs, run: StageRun) -> StageResult:
    """ETO's exploration: one shard of the policy's episodes on train tasks."""
    return play_and_store(inputs, run)


@stage("sample")
def sample_stage(inputs: ExploreInputs, run: StageRun) -> StageResult:
    """Agent-R1's and ET-Agent's groups: `samples_per_task` sampled episodes per question, with
    their log-probabilities."""
    return play_and_store(inputs, run)
