"""Stage: one shard of exploration on train tasks (mapped over shards by the flow)."""

from __future__ import annotations

from flywheel.inference import SamplingSettings
from flywheel.records import Manifest, Message
from flywheel.rollout import rollout_to_store
from flywheel.settings import EnvSettings, ExploreSettings, InferenceSettings
from flywheel.stage import stage_task, store_for


def shard(task_ids: list[str], shards: int, samples_per_task: int) -> list[list[str]]:
    """Split the (repeated) task list into at most `shards` non-empty, balanced parts."""
    work = [t for t in task_ids for _ in range(samples_per_task)]
    parts = [work[i::shards] for i in range(shards)]
    return [p for p in parts if p]


@stage_task("explore-shard")
def explore_stage(
    store_url: str,
    model_url: str,
    env: EnvSettings,
    task_ids: list[str],
    prefix: list[Message],
    inference: InferenceSettings,
    explore: ExploreSettings,
    max_steps: int,
    seed: int,
    out_url: str,
) -> Manifest:
    sampling = SamplingSettings(
        temperature=explore.temperature, max_tokens=inference.max_tokens, seed=seed
    )
    return rollout_to_store(
        store_for(store_url), "explore", model_url, env, task_ids, prefix,
        inference, max_steps, sampling, out_url,
    )  # fmt: skip
