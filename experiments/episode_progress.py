"""How far TextCraft episodes get when they fail: per stage, the base items got, the crafts done
and the actions refused ("Could not ...") an episode, from a run store's evaluation episodes.

A success rate of 0 says nothing about where a policy stops; this reads it from the observations,
pooled over every run (seed) in the store that evaluated the variant.

    python -m experiments.episode_progress runs-efficacy --variant harder
    python -m experiments.episode_progress runs-efficacy            # the greedy test evaluations
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

OUTCOMES = {
    "got": "Observation: Got",
    "crafted": "Observation: Crafted",
    "refused": "Observation: Could not",
}


def episode_counts(record: dict) -> dict[str, int]:
    """One stored episode's observations counted by outcome (the task's first message excluded)."""
    observations = [m["content"] for m in record["messages"] if m["role"] == "user"][1:]
    return {name: sum(o.startswith(p) for o in observations) for name, p in OUTCOMES.items()}


def stage_progress(store: Path, variant: str = "") -> dict[tuple[str, str], dict[str, float]]:
    """(recipe, stage) -> episodes, solved, and each outcome's mean count an episode."""
    folder = f"evaluate-{variant}" if variant else "evaluate"
    totals: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for played in sorted(store.glob(f"*/{folder}/*/trajectories.jsonl")):
        run, stage = played.parents[2].name, played.parent.name
        recipe = run.rsplit("-seed", 1)[0].removeprefix("efficacy-")
        row = totals[(recipe, stage)]
        for line in played.read_text().splitlines():
            record = json.loads(line)
            row["episodes"] += 1
            row["solved"] += bool(record["success"])
            for name, count in episode_counts(record).items():
                row[name] += count
    return {
        key: {
            k: (v if k in ("episodes", "solved") else v / row["episodes"]) for k, v in row.items()
        }
        for key, row in totals.items()
    }


def table(progress: dict[tuple[str, str], dict[str, float]]) -> list[str]:
    lines = [
        "| recipe | stage | episodes | solved | items got an episode | crafts done | refused |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (recipe, stage), row in progress.items():
        lines.append(
            f"| {recipe} | {stage} | {row['episodes']:.0f} | {row['solved']:.0f} | "
            f"{row['got']:.2f} | {row['crafted']:.2f} | {row['refused']:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="a run store folder (runs of bench.efficacy)")
    parser.add_argument("--variant", default="", help='an evaluation variant, e.g. "harder"')
    args = parser.parse_args(argv)
    progress = stage_progress(args.store, args.variant)
    if not progress:
        raise SystemExit(f"no {args.variant or 'greedy'} evaluation episodes under {args.store}")
    print("\n".join(table(progress)))


if __name__ == "__main__":
    main()
