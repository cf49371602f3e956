"""ETO's pair rule: each explored trajectory against the expert one on the same task.

The higher final reward is `chosen`; ties are skipped. When the expert wins, the failed exploration
is cut to the expert's length plus `extra_turns` turns (ETO keeps `expert + 5*2` messages). Both
sides must end on an agent turn, or the pair is dropped. An exploration that the environment ended
with an error (finish reason "error: ...") or that lost its server ("lost: ...") says nothing
about the policy: it is skipped and counted, never paired as a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from agents.rollout import ENVIRONMENT_FAILED
from flywheel.records import Message, Pair, Trajectory
from flywheel.stage import StageResult, StageRun, stage


@dataclass
class PairReport:
    wins: int = 0  # exploration beat the expert
    ties: int = 0
    losses: int = 0  # expert beat exploration
    dropped: int = 0  # a side did not end on an agent turn
    no_expert: int = 0
    crashed: int = 0  # the environment failed (or was lost) under the exploration: not paired


def ends_on_agent(messages: list[Message]) -> list[Message]:
    """`messages` without a trailing observation: a pair's sides end on an agent turn."""
    return messages[:-1] if messages and messages[-1].role == "user" else messages


def build_pairs(
    explored: list[Trajectory], expert: list[Trajectory], extra_turns: int = 5
) -> tuple[list[Pair], PairReport]:
    experts = {t.task_id: t for t in expert}
    pairs, report = [], PairReport()
    for trajectory in explored:
        if trajectory.finish_reason.startswith(ENVIRONMENT_FAILED):
            report.crashed += 1
            continue
        golden = experts.get(trajectory.task_id)
        if golden is None:
            report.no_expert += 1
            continue
        if trajectory.reward == golden.reward:
            report.ties += 1
            continue
        if trajectory.reward < golden.reward:
            report.losses += 1
            limit = len(golden.continuation) + 2 * extra_turns
            chosen, rejected = golden.continuation, trajectory.continuation[:limit]
            prompt, chosen_reward, rejected_reward = golden.prompt, golden.reward, trajectory.reward
        else:
            report.wins += 1
            chosen, rejected = trajectory.continuation, golden.continuation
            prompt, chosen_reward, rejected_reward = (
                trajectory.prompt,
                trajectory.reward,
                golden.reward,
            )
        chosen, rejected = ends_on_agent(chosen), ends_on_agent(rejected)
        if not chosen or not rejected:
            report.dropped += 1
            continue
        pairs.append(
            Pair(
                task_id=trajectory.task_id,
                prompt=prompt,
                chosen=chosen,
                rejected=rejected,
                chosen_reward=chosen_reward,
                rejected_reward=rejected_reward,
            )
        )
    return pairs, report


class BuildPairsInputs(BaseModel):
    """Every exploration shard's trajectories against the expert's on the same task."""

    explored_urls: list[str]
    expert_url: str
    extra_turns: int  # a losing exploration is cut to the expert's length plus this many turns


@stage("build-pairs")
def build_pairs_stage(inputs: BuildPairsInputs, run: StageRun) -> StageResult:
    store = run.store
    explored = [t for url in inputs.explored_urls for t in store.read_records(url, Trajectory)]
    expert = store.read_records(inputs.expert_url, Trajectory)
    pairs, report = build_pairs(explored, expert, inputs.extra_turns)
    return StageResult(
        files={"pairs": store.write_records(run.file("pairs.jsonl"), pairs)},
        counts={"pairs": len(pairs), **vars(report)},
    )
