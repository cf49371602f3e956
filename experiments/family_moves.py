"""Which question families a stage moved, and how it now plays them: pooled over runs (seeds),
per family (a QA task id's template, `founder_birth_town/company-028` -> founder_birth_town;
TextCraft's goal for other ids) the tasks, how many each stage solved, gained and lost, and the
commonest plan of each stage (the tools it called in order, `search search python answer`).

    python -m experiments.family_moves runs/issue66-eto-qa/efficacy-eto-seed{0,1,2} \\
        --before sft --after eto-round-1 --split validation

A round that fixes one family's plan error and carries the fix to families where it is wrong
shows here as gains in one family beside losses in others, the losers now playing the winners'
plan (docs/notebook.md, issue 66's candidate 4).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

from bench.run_files import read_records
from flywheel.records import Message, Trajectory
from flywheel.settings import EvaluateSettings

CALL = re.compile(r"<(search|python|answer)>|\"name\":\s*\"(\w+)\"")


def family(task_id: str) -> str:
    return task_id.split("/", 1)[0]


def call(message: Message) -> str:
    """The tool a reply called (its first call), `-` for none."""
    found = CALL.search(message.content)
    return next(g for g in found.groups() if g) if found else "-"


def plan(episode: Trajectory) -> str:
    """The tools the episode's replies called, in order (the first call of each reply)."""
    replies = episode.messages[episode.episode_start + 1 :]
    return " ".join(call(m) for m in replies if m.role == "assistant")


def stage_episodes(run: Path, split: str, stage: str) -> dict[str, Trajectory]:
    path = run / EvaluateSettings(split=split).folder / stage / "trajectories.jsonl"
    if not path.exists():
        raise SystemExit(f"no evaluation of stage {stage!r} at {path}")
    return {t.task_id: t for t in read_records(path, Trajectory)}


def family_table(pairs: list[tuple[dict, dict]]) -> list[dict]:
    """Per family, pooled over `pairs` of (before, after) episodes by task id."""
    rows: dict[str, dict] = defaultdict(
        lambda: {
            "tasks": 0,
            "before": 0,
            "after": 0,
            "gained": 0,
            "lost": 0,
            "plans_before": Counter(),
            "plans_after": Counter(),
        }  # fmt: skip
    )
    for before, after in pairs:
        for task in sorted(before.keys() & after.keys()):
            row, was, now = rows[family(task)], before[task].success, after[task].success
            row["tasks"] += 1
            row["before"] += was
            row["after"] += now
            row["gained"] += now and not was
            row["lost"] += was and not now
            row["plans_before"][plan(before[task])] += 1
            row["plans_after"][plan(after[task])] += 1
    return [{"family": name, **row} for name, row in sorted(rows.items())]


def commonest(plans: Counter) -> str:
    (shape, count), total = plans.most_common(1)[0], sum(plans.values())
    return f"{shape} ({count}/{total})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (storage_url/run_name)")
    parser.add_argument("--before", default="sft", help="evaluated stage, e.g. sft")
    parser.add_argument("--after", default="eto-round-1", help="evaluated stage")
    parser.add_argument("--split", choices=["test", "validation"], default="test")
    args = parser.parse_args(argv)
    pairs = [
        (stage_episodes(r, args.split, args.before), stage_episodes(r, args.split, args.after))
        for r in args.runs
    ]
    print(f"| family | tasks | {args.before} | {args.after} | gained | lost "
          f"| commonest plan, {args.before} | commonest plan, {args.after} |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for row in family_table(pairs):
        print(
            f"| {row['family']} | {row['tasks']} | {row['before']} | {row['after']} "
            f"| {row['gained']} | {row['lost']} | {commonest(row['plans_before'])} "
            f"| {commonest(row['plans_after'])} |"
        )


if __name__ == "__main__":
    main()
