"""Agent-R round variants from one starting policy: does a change to the round beat its start?

Runs round 1 of Agent-R once per variant, each from the same starting policy (a finished demo's
SFT model, so the start is not trained again), then evaluates each round's policy on the config's
held-out tasks, greedily, as the demo does. A variant is a name and config overrides:

    .venv/bin/python bench/agent_r_variants.py --start runs/agent-r-textcraft/sft/model \\
        --store /tmp/agent-r-variants --out bench/results-agent-r-variants.md \\
        demo: slice64:mcts.tasks_per_round=64 \\
        slice64-lr2e-4:mcts.tasks_per_round=64,revision_sft.learning_rate=2e-4,revision_sft.epochs=2

Stages are cached in `--store` like any run's: variants sharing their search settings share
the trees and critiques, and a re-run resumes. The table: each variant's solved tasks (n, Wilson
95% interval), which tasks it gained and lost against the start, and the round's data counts.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flywheel.confidence import wilson_interval  # noqa: E402
from flywheel.records import Trajectory  # noqa: E402
from flywheel.settings import AgentRConfig, load_config  # noqa: E402
from flywheel.storage import ArtifactStore, normalise_url  # noqa: E402


def solved(store: ArtifactStore, evaluation) -> set[str]:
    episodes = store.read_records(evaluation.files["trajectories"], Trajectory)
    return {t.task_id for t in episodes if t.success}


def run_variants(config: str, start: str, store_url: str, variants: list[str]) -> list[dict]:
    from prefect import flow

    from flows.agent_r import AgentR
    from ops.driver import RoundState

    @flow(name="agent-r-variants")
    def variants_flow() -> list[dict]:
        store, rows = ArtifactStore(store_url), []
        for spec in variants:
            name, _, overrides = spec.partition(":")
            settings = [f"run_name={name}", "baselines=false"]
            cfg = load_config(
                AgentRConfig, config, settings + [o for o in overrides.split(",") if o]
            )
            recipe = AgentR(cfg, store, None)
            if not rows:  # the start, evaluated once, in the first variant's run folder
                start_solved = solved(store, recipe.evaluate("start", start)[1])
                rows.append({"name": "start", "overrides": "", "solved": start_solved,
                             "n": len(recipe.test_ids), "note": ""})  # fmt: skip
            result = recipe.round(RoundState(round=1, policy=start, start_policy=start))
            tasks = (
                solved(store, recipe.evaluate(name, result.policy)[1]) if result.policy else set()
            )
            rows.append({"name": name, "overrides": overrides, "solved": tasks,
                         "n": len(recipe.test_ids), "note": " ".join(result.notes)})  # fmt: skip
        return rows

    return variants_flow()


def table(rows: list[dict]) -> str:
    start = rows[0]["solved"]
    lines = [
        "| variant | overrides | solved (n) | success rate | 95% interval (Wilson) | gained | lost |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        k, n = len(row["solved"]), row["n"]
        low, high = wilson_interval(k, n)
        gained = ", ".join(sorted(row["solved"] - start)) or "–"
        lost = ", ".join(sorted(start - row["solved"])) or "–"
        lines.append(
            f"| {row['name']} | {row['overrides'] or '–'} | {k}/{n} | {k / n:.1%} | "
            f"{low:.1%}–{high:.1%} | {gained} | {lost} |"
        )
    notes = [f"- {row['name']}: {row['note']}" for row in rows if row["note"]]
    return "\n".join(lines + [""] + notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="NAME:key=value,key=value (NAME: for none)")
    parser.add_argument("--config", default="configs/agent_r_textcraft.yaml")
    parser.add_argument("--start", required=True, help="the starting policy's model folder")
    parser.add_argument("--store", required=True, help="where the variants' stages are cached")
    parser.add_argument("--out", help="append the table to this markdown file")
    args = parser.parse_args(argv)
    names = [v.partition(":")[0] for v in args.variants]
    if len(set(names)) != len(names) or "start" in names:
        parser.error(f"variant names must be distinct and not 'start': {names}")
    if not Path(args.start, "config.json").is_file():
        parser.error(f"--start {args.start!r} is not a model folder (no config.json)")
    rows = run_variants(args.config, normalise_url(args.start), args.store, args.variants)
    text = table(rows)
    print(text)
    if args.out:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        header = (
            f"\n## {stamp}, {platform.node()} ({platform.machine()})\n\n"
            f"```\n.venv/bin/python bench/agent_r_variants.py {' '.join(sys.argv[1:])}\n```\n\n"
        )
        with open(args.out, "a") as out:
            out.write(header + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
