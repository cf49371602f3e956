"""What an RL round's sampled groups teach, and what its policy then does differently.

    python -m experiments.rl_signal runs/agent-r1-qa/round-1/sample/trajectories.jsonl
    python -m experiments.rl_signal SAMPLES --before WARM/trajectories.jsonl --after RL/trajectories.jsonl

The first table splits the sampled episodes of the groups the round trains on (`--groups mixed`:
those holding both a success and a failure, `rl.groups`'s default in the QA configs) by what the
episode did (answered or not, succeeded or not, which tools it called) and gives each kind's
GRPO advantage (`training.advantages.grpo_advantages` on the episodes' rewards): its mean, its
sum (the weight `rl.aggregation=sequence-mean` gives the kind) and its sum weighted by the
episodes' loss tokens (what `token-mean` gives it). A kind with a negative sum is pushed down.
The second counts the trained groups by question family (the task id's part before "/").
With `--before` and `--after` (two greedy evaluations of the same tasks), successes per family
and the episodes' behaviour (answered, tool calls, format) before and after.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch

from agents.episode_metrics import episode_metric_means, reward_groups
from flywheel.records import Trajectory
from training.advantages import group_index, grpo_advantages
from training.rl import mixed_outcome_groups, read_trajectories


def trained_groups(episodes: list[Trajectory], groups: str) -> list[Trajectory]:
    """The episodes of the groups the round trains on, as the trainer picks them: holding both
    a success and a failure (`mixed`, `training.rl.mixed_outcome_groups`), or any with reward
    variance (`all`: the others' advantages are 0). An episode without a group id is a group of
    one, never trained on."""
    if groups == "mixed":
        return mixed_outcome_groups(episodes)
    varied = {g for g, rewards in reward_groups(episodes).items() if len(set(rewards)) > 1}
    return [e for e in episodes if e.group_id in varied]


def tools_called(episode: Trajectory) -> str:
    """The tools the episode's replies called, in a fixed order ("-" for none)."""
    replies = " ".join(m.content for m in episode.continuation if m.role == "assistant")
    called = [tool for tool in ("search", "python") if f"<{tool}>" in replies]
    return "+".join(called) or "-"


def loss_tokens(episode: Trajectory) -> int:
    """The tokens the policy sampled in the episode's loss turns (the trainer's mask also holds
    each turn's end token where the model generated it)."""
    return sum(len(m.token_ids or ()) for m in episode.continuation if m.loss)


def kind(episode: Trajectory) -> tuple[str, str, str]:
    answered = "answered" if episode.metrics.get("answered") else "no answer"
    return answered, "success" if episode.success else "failure", tools_called(episode)


def advantage_by_kind(episodes: list[Trajectory]) -> dict[tuple, dict[str, float]]:
    """Per kind of episode: count, mean and summed GRPO advantage, and the sum weighted by
    loss tokens."""
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float64)
    groups = group_index([e.group_id for e in episodes])
    ones = torch.ones(len(episodes), 1)
    advantages = grpo_advantages(rewards, groups, ones)[:, 0].tolist()
    table: dict[tuple, dict[str, float]] = {}
    for episode, advantage in zip(episodes, advantages, strict=True):
        row = table.setdefault(kind(episode), {"n": 0, "sum": 0.0, "token_sum": 0.0})
        row["n"] += 1
        row["sum"] += advantage
        row["token_sum"] += advantage * loss_tokens(episode)
    for row in table.values():
        row["mean"] = row["sum"] / row["n"]
    return table


def family(task_id: str) -> str:
    return task_id.split("/", 1)[0]


def behaviour(episodes: list[Trajectory]) -> dict[str, dict[str, float]]:
    """Per family: episodes, solved, and the mean of each environment metric
    (`episode_<name>`, `agents.episode_metrics.episode_metric_means`)."""
    by_family = collections.defaultdict(list)
    for episode in episodes:
        by_family[family(episode.task_id)].append(episode)
    return {
        name: {
            "episodes": len(members),
            "solved": sum(e.success for e in members),
            **episode_metric_means(members),
        }
        for name, members in by_family.items()
    }


def print_signal(samples: list[Trajectory], groups: str) -> None:
    trained = trained_groups(samples, groups)
    count = len({e.group_id for e in trained})
    print(
        f"{len(samples)} sampled episodes; {count} groups trained on ({groups}), {len(trained)} episodes\n"
    )
    print("| answered | outcome | tools | episodes | mean advantage | sum | sum x loss tokens |")
    print("|---|---|---|---:|---:|---:|---:|")
    for key, row in sorted(advantage_by_kind(trained).items()):
        print(
            f"| {' | '.join(key)} | {row['n']} | {row['mean']:+.2f} | {row['sum']:+.1f} | "
            f"{row['token_sum']:+.0f} |"
        )
    families = collections.Counter(family(g) for g in {e.group_id for e in trained})
    print("\ntrained groups by family: " + ", ".join(f"{f} {n}" for f, n in families.most_common()))


def print_behaviour(before: list[Trajectory], after: list[Trajectory]) -> None:
    was, now = behaviour(before), behaviour(after)
    metrics = sorted(
        {m for rows in (was, now) for row in rows.values() for m in row} - {"episodes", "solved"}
    )
    print(
        "\n| family | episodes | solved before | solved after | "
        + " | ".join(f"{m.removeprefix('episode_')} before / after" for m in metrics)
        + " |"
    )
    print("|---|---:|---:|---:|" + "---|" * len(metrics))
    for name in sorted(set(was) | set(now)):
        a, b = was.get(name, {}), now.get(name, {})
        cells = " | ".join(f"{a.get(m, 0):.2f} / {b.get(m, 0):.2f}" for m in metrics)
        print(
            f"| {name} | {int(a.get('episodes', 0))} | {int(a.get('solved', 0))} | {int(b.get('solved', 0))} | {cells} |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="a sample stage's trajectories.jsonl")
    parser.add_argument("--groups", choices=["mixed", "all"], default="mixed", help="rl.groups")
    parser.add_argument("--before", type=Path, help="the starting policy's evaluation trajectories")
    parser.add_argument("--after", type=Path, help="the trained policy's, on the same tasks")
    args = parser.parse_args(argv)
    print_signal(read_trajectories(args.samples), args.groups)
    if args.before and args.after:
        print_behaviour(read_trajectories(args.before), read_trajectories(args.after))


if __name__ == "__main__":
    main()
