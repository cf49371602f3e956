"""Stage: the sampled groups of several sample stages in one file, for one RL update.

DAPO's dynamic sampling: when a round's groups hold too few with both a success and a failure
(the only ones an outcome reward teaches anything from), the round samples further slices of
questions, each a cached sample stage of its own, and pools them here. Groups keep their ids
(the question); a question sampled in two slices of a round forms one larger group."""

from __future__ import annotations

from pydantic import BaseModel, Field

from agents.episode_metrics import reward_groups
from flywheel.records import Trajectory
from flywheel.stage import StageResult, StageRun, stage
from training.pareto import mixed_group_ids


class PoolInputs(BaseModel):
    """The sample stages' trajectory files, in the order they were sampled."""

    data_urls: list[str] = Field(min_length=1)


@stage("pool-samples")
def pool_samples_stage(inputs: PoolInputs, run: StageRun) -> StageResult:
    pooled = [t for url in inputs.data_urls for t in run.store.read_records(url, Trajectory)]
    url = run.store.write_records(run.file("trajectories.jsonl"), pooled)
    return StageResult(files={"trajectories": url}, counts=group_counts(pooled))


def group_counts(trajectories: list[Trajectory]) -> dict[str, int]:
    """Episodes, groups, and groups holding both a success and a failure."""
    mixed = mixed_group_ids((t.group_id, t.success) for t in trajectories)
    return {
        "episodes": len(trajectories),
        "groups": len(reward_groups(trajectories)),
        "mixed_groups": len(mixed),
    }
