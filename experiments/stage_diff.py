"""Did a training stage change the policy? Compare two evaluated stages of one run episode by
episode: how many greedy episodes are identical (every reply the same), and which tasks were
gained or lost.

    python -m experiments.stage_diff runs/eto-textcraft sft eto-round-1
    python -m experiments.stage_diff runs/eto-textcraft sft eto-round-1 --split validation

A round whose success rate equals its start's can be a policy that did not move (every episode
identical: the update was too small) or one that moved without net effect (episodes differ,
gains cancel losses); this says which.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.run_files import read_records
from flywheel.records import Trajectory
from flywheel.settings import EvaluateSettings


def episodes(path: Path) -> dict[str, tuple[list[str], bool]]:
    """Task id -> (the assistant's replies, solved) of one stage's evaluation trajectories."""
    out = {}
    for episode in read_records(path, Trajectory):
        replies = [m.content for m in episode.messages if m.role == "assistant"]
        out[episode.task_id] = (replies, episode.success)
    return out


def compare(before: dict, after: dict) -> dict:
    """Identical episodes, tasks gained and lost, over the tasks both stages evaluated."""
    tasks = sorted(before.keys() & after.keys())
    return {
        "tasks": len(tasks),
        "identical": sum(before[t][0] == after[t][0] for t in tasks),
        "gained": [t for t in tasks if after[t][1] and not before[t][1]],
        "lost": [t for t in tasks if before[t][1] and not after[t][1]],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a run's folder (storage_url/run_name)")
    parser.add_argument("before", help="evaluated stage, e.g. sft")
    parser.add_argument("after", help="evaluated stage, e.g. eto-round-1")
    parser.add_argument("--split", choices=["test", "validation"], default="test",
                        help="which evaluations: validation while choosing settings")  # fmt: skip
    args = parser.parse_args(argv)
    folder = args.run / EvaluateSettings(split=args.split).folder
    for stage in (args.before, args.after):
        if not (folder / stage / "trajectories.jsonl").exists():
            known = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
            parser.error(f"no evaluation of stage {stage!r} in {folder}; evaluated: {known}")
    result = compare(
        episodes(folder / args.before / "trajectories.jsonl"),
        episodes(folder / args.after / "trajectories.jsonl"),
    )
    print(
        f"{args.before} -> {args.after}: {result['identical']}/{result['tasks']} episodes "
        f"identical; gained {len(result['gained'])} {result['gained']}, lost "
        f"{len(result['lost'])} {result['lost']}"
    )


if __name__ == "__main__":
    main()
