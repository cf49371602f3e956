"""Numbers about a batch of played episodes: tokens generated, how episodes ended, and how the
sampled groups' rewards spread (what a group-relative advantage can learn from)."""

from __future__ import annotations

from flywheel.records import Trajectory
from training.pareto import mixed_group_ids


def generated_tokens(trajectory: Trajectory) -> int:
    """Tokens the model sampled in the episode (its replies' ids as generated)."""
    return sum(len(m.token_ids or ()) for m in trajectory.messages)


def episode_metric_means(trajectories: list[Trajectory]) -> dict[str, float]:
    """The mean of each per-episode metric the environment measured (`Trajectory.metrics`), as
    `episode_<name>`; an episode without a metric (one that could not start) counts as 0."""
    names = sorted({name for t in trajectories for name in t.metrics})
    n = len(trajectories)
    return {f"episode_{k}": sum(t.metrics.get(k, 0.0) for t in trajectories) / n for k in names}


def reward_groups(trajectories: list[Trajectory]) -> dict[str, list[float]]:
    """Rewards per group id (sampled groups only)."""
    groups: dict[str, list[float]] = {}
    for t in trajectories:
        if t.group_id is not None:
            groups.setdefault(t.group_id, []).append(t.reward)
    return groups


def zero_variance_share(groups: dict[str, list[float]]) -> float:
    """Share of groups whose samples all earned the same reward: a group-relative advantage is 0
    on every one of their tokens, so they teach the policy nothing."""
    flat = sum(1 for rewards in groups.values() if max(rewards) - min(rewards) < 1e-9)
    return flat / len(groups) if groups else 0.0


def mixed_outcome_share(trajectories: list[Trajectory]) -> float:
    """Share of the sampled groups holding both a success and a failure: the groups a signal on
    the outcome itself comes from (`rl.groups: mixed` trains on these alone)."""
    groups = {t.group_id for t in trajectories if t.group_id is not None}
    mixed = mixed_group_ids((t.group_id, t.success) for t in trajectories)
    return len(mixed) / len(groups) if groups else 0.0


def ending_counts(trajectories: list[Trajectory]) -> dict[str, int]:
    """How episodes ended (ended_done, ended_max_steps, ended_error, ...) and how many moved to
    another environment server on the way (`retried`: episodes, `recoveries`: moves)."""
    counts: dict[str, int] = {}
    for t in trajectories:
        key = "ended_" + t.finish_reason.split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    return counts | recovery_counts(trajectories)


def recovery_counts(trajectories: list[Trajectory]) -> dict[str, int]:
    """Episodes that moved to another environment server on the way (`retried`), and their
    moves (`recoveries`)."""
    return {
        "retried": sum(1 for t in trajectories if t.recoveries),
        "recoveries": sum(t.recoveries for t in trajectories),
    }
