"""Stage: ET-Agent's behaviour-calibration data: which sampled groups an RL update trains on, and
the efficiency reward each of their episodes earns.

Reads the groups a `sample` stage wrote (K episodes per question, with group ids and the
environment's per-episode metrics), keeps at most `budget` groups by group-wise Pareto sampling
(`training.pareto.select_groups`: variance of tool calls and of correctness, then only groups
with both a success and a failure), and replaces each kept episode's reward by the efficiency
reward (`training.efficiency.efficiency_rewards`) at this iteration's sigmas. The RL stage then
trains on these trajectories as it would on any others. Every group's reason for being kept or
dropped is written next to them, for a person reading why the policy learned what it did.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from agents.episode_metrics import generated_tokens
from flywheel.records import Trajectory
from flywheel.settings import Strict
from flywheel.stage import StageResult, StageRun, stage
from training.efficiency import decayed_sigma, efficiency_rewards
from training.pareto import GroupSelection, RolloutGroup, select_groups


class CalibrationSettings(Strict):
    """ET-Agent's behaviour calibration: which sampled groups an RL update trains on (group-wise
    Pareto sampling) and the efficiency reward they earn (`training/efficiency.py`)."""

    method: Literal["efficiency", "plain"] = "efficiency"
    """"efficiency": ET-Agent's selection and reward; "plain": every sampled group with the
    environment's own reward (Agent-R1's GRPO on the same samples: the comparison).
    """
    budget: int | None = Field(default=None, ge=1)
    """Groups Pareto sampling keeps at most per iteration (before the mixed-result filter); None:
    half the sampled groups.
    """
    sigma_tool: float = Field(default=0.2, ge=0)
    """sharpness of the tool-call factor"""
    sigma_length: float = Field(default=0.5, ge=0)
    """sharpness of the length factor"""
    correctness: Literal["f1", "exact_match"] = "f1"
    """Correctness in the reward and in the Pareto objectives: token F1 (the paper's for QA) or
    exact match; a rollout above `success_threshold` is a success.
    """
    success_threshold: float = Field(default=0.8, ge=0, lt=1)
    """correctness above this is a success"""
    iterations: int = Field(default=1, ge=1)
    """Sample → select → RL iterations per curriculum stage; both sigmas fall linearly to 0 over
    them and start again at the next stage.
    """


class CalibrateInputs(BaseModel):
    """One iteration's sampled groups and where in its curriculum stage the iteration is."""

    data_url: str
    """`Trajectory` records with group ids (a sample stage's)"""
    settings: CalibrationSettings
    iteration: int
    """0-based, within the curriculum stage: sigma falls over the iterations"""


def correctness_of(trajectory: Trajectory, measure: str) -> float:
    """The episode's correctness on the chosen measure (0 for an episode that never answered)."""
    return float(trajectory.metrics.get(measure, 0.0))


def groups_of(trajectories: list[Trajectory]) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.group_id is None:
            raise ValueError(
                f"episode of task {t.task_id} has no group id: calibration reads groups of "
                "samples (sample.samples_per_task >= 2)"
            )
        groups.setdefault(t.group_id, []).append(t)
    return groups


def rolled_groups(groups: dict[str, list[Trajectory]], measure: str) -> list[RolloutGroup]:
    return [
        RolloutGroup(
            group_id=group_id,
            correctness=[correctness_of(t, measure) for t in episodes],
            tool_calls=[int(t.metrics.get("tool_calls", 0)) for t in episodes],
        )
        for group_id, episodes in groups.items()
    ]


def rewarded(episodes: list[Trajectory], measure: str, sigmas: tuple[float, float]) -> list:
    """The group's episodes with their rewards replaced by the efficiency reward."""
    rewards = efficiency_rewards(
        [correctness_of(t, measure) for t in episodes],
        [int(t.metrics.get("tool_calls", 0)) for t in episodes],
        [generated_tokens(t) for t in episodes],
        [bool(t.metrics.get("format_valid", 0.0)) for t in episodes],
        sigma_tool=sigmas[0],
        sigma_length=sigmas[1],
    )
    return [t.model_copy(update={"reward": r}) for t, r in zip(episodes, rewards, strict=True)]


def iteration_sigmas(settings: CalibrationSettings, iteration: int) -> tuple[float, float]:
    """Both sigmas at this iteration: the stage's initial values falling linearly to 0 over its
    iterations (the advantages of one sampled batch are computed once, so sigma is fixed within
    an RL update and falls between them)."""
    total = settings.iterations
    return (
        decayed_sigma(settings.sigma_tool, iteration, total),
        decayed_sigma(settings.sigma_length, iteration, total),
    )


@stage("calibrate")
def calibrate_stage(inputs: CalibrateInputs, run: StageRun) -> StageResult:
    """The kept groups' episodes with efficiency rewards in `trajectories.jsonl`; each group's
    reason in `selection.json`."""
    settings = inputs.settings
    groups = groups_of(run.store.read_records(inputs.data_url, Trajectory))
    if settings.method == "plain":
        return every_group(groups, run)
    budget = settings.budget or max(1, len(groups) // 2)
    selection = select_groups(
        rolled_groups(groups, settings.correctness), budget, settings.success_threshold
    )
    sigmas = iteration_sigmas(settings, inputs.iteration)
    kept = [t for g in selection.kept for t in rewarded(groups[g], settings.correctness, sigmas)]
    url = run.store.write_records(run.file("trajectories.jsonl"), kept)
    reasons = run.store.write_json(run.file("selection.json"), selection.model_dump())
    return StageResult(
        files={"trajectories": url, "selection": reasons},
        counts={"groups": len(groups), "kept_groups": len(selection.kept), "episodes": len(kept)},
        metrics={
            "kept_group_share": len(selection.kept) / len(groups) if groups else 0.0,
            "sigma_tool": sigmas[0],
            "sigma_length": sigmas[1],
            "mean_reward": sum(t.reward for t in kept) / len(kept) if kept else 0.0,
        },
    )


def every_group(groups: dict[str, list[Trajectory]], run: StageRun) -> StageResult:
    """The comparison: all groups with the environment's rewards, as plain GRPO trains."""
    episodes = [t for g in groups.values() for t in g]
    url = run.store.write_records(run.file("trajectories.jsonl"), episodes)
    reasons = {
        g: "kept: plain GRPO trains on every group (calibration.method=plain)" for g in groups
    }
    selection = GroupSelection(kept=list(groups), dropped=[], reasons=reasons)
    return StageResult(
        files={
            "trajectories": url,
            "selection": run.store.write_json(run.file("selection.json"), selection.model_dump()),
        },
        counts={"groups": len(groups), "kept_groups": len(groups), "episodes": len(episodes)},
        metrics={
            "kept_group_share": 1.0,
            "mean_reward": sum(t.reward for t in episodes) / len(episodes) if episodes else 0.0,
        },
    )
