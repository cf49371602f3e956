"""Does a gain on sampled episodes show a policy that knows more, or one that samples less at
random? RL trains on episodes drawn at temperature 1.0 and sharpens the distribution they come
from; a stage that only sharpens gains at temperature 1.0 what its start already had greedily.
This replays two stages' sampled evaluations of finished runs at other temperatures and
compares them, sample by sample, at each temperature, beside the greedy (0) and the runs' own
(`evaluate.temperature`) ones.

    python -m experiments.temperature_sweep --runs runs-efficacy/efficacy-agent-r1-seed0 \\
        --start warm-start --stage rl-round-1 --temperatures 0.5 --out bench/results-temp.md

Each run must have evaluated both stages with `evaluate.samples` (`evaluate-sampled/<stage>/`):
its manifest gives the episodes' inputs (model, tasks, seeds, k), of which only the temperature
changes. Replays go under `<run>/temperature-sweep/T<t>/<stage>/`, each a cached stage (a
finished replay is read, not played again: a stopped sweep resumes), and are not part of the
run's report.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def sampled_inputs(run: Path, stage: str) -> dict:
    """The inputs of `stage`'s sampled evaluation in `run`, as its manifest recorded them."""
    manifest = run / "evaluate-sampled" / stage / "_MANIFEST.json"
    if not manifest.is_file():
        raise SystemExit(
            f"{manifest} is missing: run the recipe with evaluate.samples=k so that {stage} has "
            "a sampled evaluation to replay"
        )
    inputs = dict(json.loads(manifest.read_text())["key_inputs"])
    inputs.pop("stage", None)
    return inputs


def outcomes(trajectories: Path) -> list[dict[str, bool]]:
    """Per sample index, task -> solved (the report's reading: success, not reward)."""
    from tasks.report import outcomes_by_sample

    played = [json.loads(line) for line in trajectories.read_text().splitlines() if line]
    return outcomes_by_sample([(t["task_id"], bool(t["success"])) for t in played])


def replay(run: Path, stage: str, temperature: float) -> Path:
    """`stage`'s sampled evaluation played again at `temperature`; its trajectories' path."""
    from flywheel.stage import StageOutput
    from tasks.evaluate import EvaluateInputs, evaluate_stage

    folder = run / "temperature-sweep" / f"T{temperature:g}" / stage
    # A stage's cache: a replay whose manifest is current (written last, so never a half-played
    # one) is read, not played again.
    inputs = EvaluateInputs(**{**sampled_inputs(run, stage), "temperature": temperature})
    started = time.perf_counter()
    evaluate_stage.fn(
        inputs, StageOutput(store_url=f"file://{run}", url=f"file://{folder}", label=stage)
    )
    print(f"{run.name} {stage} T={temperature:g}: {time.perf_counter() - started:.0f} s")
    return folder / "trajectories.jsonl"


def evaluation(run: Path, stage: str, temperature: float | None) -> list[dict[str, bool]]:
    """The run's own greedy (None) or sampled (its temperature) evaluation, or a replay."""
    if temperature is None:
        return outcomes(run / "evaluate" / stage / "trajectories.jsonl")
    if temperature == sampled_inputs(run, stage)["temperature"]:
        return outcomes(run / "evaluate-sampled" / stage / "trajectories.jsonl")
    return outcomes(replay(run, stage, temperature))


def row(runs: list[Path], start: str, stage: str, temperature: float | None) -> str:
    """One temperature: both stages' success over all cells, and stage against start."""
    from flywheel.confidence import paired_comparison

    pairs = []
    for run in runs:
        before, after = evaluation(run, start, temperature), evaluation(run, stage, temperature)
        pairs += list(zip(before, after, strict=True))
    c = paired_comparison(pairs)
    solved = [sum(sum(o.values()) for o in side) for side in zip(*pairs, strict=True)]
    label = "greedy" if temperature is None else f"{temperature:g}"
    return (
        f"| {label} | {c['cells']} | {solved[0]}/{c['cells']} | {solved[1]}/{c['cells']} | "
        f"+{c['gained']} -{c['lost']} | {c['difference']:+.1%} | "
        f"{c['low']:+.1%} to {c['high']:+.1%} | {c['p']:.4f} |"
    )


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", required=True, help="finished runs' folders")
    parser.add_argument("--start", required=True, help="the stage compared against")
    parser.add_argument("--stage", required=True, help="the stage trained from --start")
    parser.add_argument("--temperatures", nargs="+", type=float, required=True)
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    runs = [Path(r).resolve() for r in args.runs]
    for run in runs:  # before any episode: every run has what the sweep replays
        for stage in (args.start, args.stage):
            sampled_inputs(run, stage)
    own = {sampled_inputs(run, args.start)["temperature"] for run in runs}
    temperatures = sorted({*args.temperatures, *own})
    lines = [
        f"| temperature | cells | {args.start} solved | {args.stage} solved | gained, lost | "
        "difference | 95% interval (paired bootstrap) | McNemar exact p |",
        "|---|---:|---:|---:|---|---:|---|---:|",
        row(runs, args.start, args.stage, None),
        *(row(runs, args.start, args.stage, t) for t in temperatures),
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        command = "python -m experiments.temperature_sweep " + " ".join(argv or [])
        Path(args.out).write_text(f"Command: `{command}`\n\n{table}\n")
    return table


if __name__ == "__main__":  # vLLM's engine process re-imports this module
    import sys

    main(sys.argv[1:])
