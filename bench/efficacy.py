"""Efficacy: does each recipe make the agent better? ETO and Agent-R on TextCraft at a larger budget
than the demos, over several seeds, on every held-out task of the chosen difficulty.

Each (recipe, seed) is one ordinary run of the recipe's flow (`python -m flows.eto|agent_r`) in
its own process and store folder, so a killed bench resumes where it stopped: finished stages are
served from their manifests. Then, per stage:

- mean success rate over seeds, with a 95% interval from a bootstrap over seeds and tasks (both
  resampled: seeds share tasks, so episodes are not independent draws);
- tokens trained to reach the stage (SFT, DPO and revision SFT rows x epochs, cumulative) and the
  recipe's wall time;
- per seed, whether the orderings the papers predict hold: SFT < ETO round 1 <= ETO round 2, and
  ETO's last round <= Agent-R's last round.

It writes a markdown report and a learning-curve plot. The command, machine and date go in it.

    python bench/efficacy.py                          # 3 seeds, the budget below (2 CPU cores)
    python bench/efficacy.py --seeds 0 --rounds 1     # one seed, one round: a quick look
    python bench/efficacy.py --gpu                    # one GPU: every train task each round

On a GPU machine (the flows use it when torch sees one) `--gpu` explores or searches every train
task each round, as the papers do, and freezes no layer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flywheel.confidence import wilson_interval  # noqa: E402

RECIPES = {  # recipe -> (flow module, shipped config)
    "eto": ("flows.eto", "configs/eto_textcraft.yaml"),
    "agent-r": ("flows.agent_r", "configs/agent_r_textcraft.yaml"),
}
# The budget on top of the shipped configs: every easy train task, every easy held-out task,
# and (with --rounds 2) twice the demos' rounds. Per recipe, the slice of train tasks a round
# explores or searches: ETO twice the demo's 16; Agent-R 32 a round, so its two rounds search
# the 64 tasks of the demo's one and the bench fits in about two hours on 2 cores.
BUDGET = ["env.train_tasks=99", "env.test_tasks=26", "env.max_expert_steps=4"]
RECIPE_BUDGET = {
    "eto": ["explore.tasks_per_round=32"],
    "agent-r": ["mcts.tasks_per_round=32", "baselines=false"],
}
# On a GPU (--gpu): the papers' way, every train task explored or searched each round, and no
# layer frozen (freezing only saves CPU time).
GPU_BUDGET = {
    "eto": ["explore.tasks_per_round=99", "sft.frozen_layers=0", "dpo.frozen_layers=0"],
    "agent-r": [
        "mcts.tasks_per_round=99", "baselines=false", "sft.frozen_layers=0",
        "revision_sft.frozen_layers=0",
    ],
}  # fmt: skip
TRAINING_STAGES = ("sft", "round-", "baselines")  # folders whose manifests hold trainer metrics


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each recipe")
    parser.add_argument("--store", default=str(ROOT / "runs-efficacy"), help="folder or s3:// URL")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, as the flows"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results-efficacy.md")
    parser.add_argument("--bootstrap", type=int, default=2000, help="resamples for the intervals")
    parser.add_argument(
        "--gpu", action="store_true", help="the GPU budget: every train task each round, no "
        "layer frozen (see GPU_BUDGET)"
    )  # fmt: skip
    return parser.parse_args(argv)


def recipe_budget(recipe: str, gpu: bool) -> list[str]:
    return (GPU_BUDGET if gpu else RECIPE_BUDGET)[recipe]


def run_name(recipe: str, seed: int) -> str:
    return f"efficacy-{recipe}-seed{seed}"


def run_recipe(recipe: str, seed: int, args) -> float:
    """Run one recipe on one seed to the end; its wall time in seconds."""
    module, config = RECIPES[recipe]
    command = [
        sys.executable, "-m", module, "--config", str(ROOT / config),
        f"storage_url={args.store}", f"run_name={run_name(recipe, seed)}", f"seed={seed}",
        f"rounds={args.rounds}", *BUDGET, *recipe_budget(recipe, args.gpu), *args.set,
    ]  # fmt: skip
    print("+", shlex.join(command), flush=True)
    started = time.monotonic()
    subprocess.run(command, check=True, cwd=ROOT)
    return time.monotonic() - started


def stage_outcomes(store: Path, recipe: str, seed: int) -> dict[str, dict[str, bool]]:
    """Stage label -> task id -> solved, from the run's evaluation trajectories."""
    folder = store / run_name(recipe, seed) / "evaluate"
    outcomes = {}
    for stage in json.loads((store / run_name(recipe, seed) / "results.json").read_text()):
        label = stage["stage"]
        lines = (folder / label / "trajectories.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        outcomes[label] = {r["task_id"]: bool(r["success"]) for r in records}
    return outcomes


def tokens_trained(store: Path, recipe: str, seed: int) -> dict[str, int]:
    """Trainer folder -> tokens its training forwarded (rows' tokens x epochs)."""
    tokens = {}
    for manifest in sorted((store / run_name(recipe, seed)).rglob("_MANIFEST.json")):
        data = json.loads(manifest.read_text())
        metrics = data.get("metrics", {})
        if "tokens_per_epoch" in metrics:
            folder = manifest.parent.relative_to(store / run_name(recipe, seed))
            tokens[str(folder)] = round(metrics["tokens_per_epoch"] * metrics.get("epoch", 1))
    return tokens


def bootstrap_interval(table: list[dict[str, bool]], resamples: int, seed: int = 0):
    """95% percentile interval of the mean success over seeds (rows) and tasks, both resampled."""
    rng = random.Random(seed)
    tasks = sorted(table[0])
    means = []
    for _ in range(resamples):
        seeds = [rng.choice(table) for _ in table]
        picked = [rng.choice(tasks) for _ in tasks]
        means.append(sum(row[t] for row in seeds for t in picked) / (len(seeds) * len(picked)))
    means.sort()
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def cumulative_tokens(tokens: dict[str, int], stage: str) -> int:
    """Tokens trained to reach an evaluated stage: SFT, plus every round up to its own."""
    total = sum(v for k, v in tokens.items() if k.startswith("sft"))
    if "round-" in stage:
        last = int(stage.rsplit("-", 1)[1])
        total += sum(
            v
            for k, v in tokens.items()
            if k.startswith("round-") and int(k.split("/")[0].split("-")[1]) <= last
        )
    return total if stage != "untrained" else 0


def orderings(per_seed: dict[str, dict[str, float]], rounds: int) -> list[str]:
    """Per seed, the orderings the papers predict, each marked as holding or not."""
    lines = []
    for seed, rates in sorted(per_seed.items()):
        checks = []
        eto = [rates.get(f"eto:eto-round-{r}") for r in range(1, rounds + 1)]
        if eto and eto[0] is not None and "eto:sft" in rates:
            checks.append(("SFT < ETO round 1", rates["eto:sft"] < eto[0]))
            checks += [
                (f"ETO round {r} <= round {r + 1}", eto[r - 1] <= eto[r])
                for r in range(1, len(eto))
                if eto[r] is not None
            ]
        agent_r = rates.get(f"agent-r:agent-r-round-{rounds}")
        if eto and eto[-1] is not None and agent_r is not None:
            checks.append((f"ETO round {rounds} <= Agent-R round {rounds}", eto[-1] <= agent_r))
        marks = ", ".join(f"{name}: {'holds' if ok else 'does not hold'}" for name, ok in checks)
        lines.append(f"- seed {seed}: {marks or 'nothing to compare'}")
    return lines


def learning_curve(curves: dict[str, list[tuple[str, float, float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for recipe, points in curves.items():
        xs = list(range(len(points)))
        means = [100 * p[1] for p in points]
        errors = [[100 * (p[1] - p[2]) for p in points], [100 * (p[3] - p[1]) for p in points]]
        ax.errorbar(xs, means, yerr=errors, marker="o", capsize=4, label=recipe)
        for x, point in zip(xs, points, strict=True):
            ax.annotate(point[0], (x, 100 * point[1]), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")  # fmt: skip
    ax.set_xlabel("stage (untrained, SFT, rounds)")
    ax.set_ylabel("held-out success (%)\nbars: 95% bootstrap interval")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    store = Path(args.store.removeprefix("file://"))
    walls = {}
    for seed in args.seeds:
        for recipe in args.recipes:
            walls[(recipe, seed)] = run_recipe(recipe, seed, args)
        # A report after every seed: a bench stopped midway still leaves what it measured.
        finished = [s for s in args.seeds if all((r, s) in walls for r in args.recipes)]
        write_report(args, store, finished, walls, argv)


def write_report(args, store: Path, seeds: list[int], walls: dict, argv) -> None:
    rows, curves, per_seed = [], {}, {s: {} for s in seeds}
    for recipe in args.recipes:
        outcomes = {s: stage_outcomes(store, recipe, s) for s in seeds}
        tokens = {s: tokens_trained(store, recipe, s) for s in seeds}
        curves[recipe] = []
        for stage in outcomes[seeds[0]]:
            table = [outcomes[s][stage] for s in seeds if stage in outcomes[s]]
            rates = [sum(t.values()) / len(t) for t in table]
            for s, rate in zip(seeds, rates, strict=False):
                per_seed[s][f"{recipe}:{stage}"] = rate
            mean = sum(rates) / len(rates)
            low, high = bootstrap_interval(table, args.bootstrap)
            solved, n = sum(sum(t.values()) for t in table), sum(len(t) for t in table)
            w_low, w_high = wilson_interval(solved, n)
            trained = sum(cumulative_tokens(tokens[s], stage) for s in seeds) / len(table)
            rows.append(
                f"| {recipe} | {stage} | {mean:.1%} | {low:.1%}–{high:.1%} | {w_low:.1%}–"
                f"{w_high:.1%} | {solved}/{n} | {', '.join(f'{r:.0%}' for r in rates)} "
                f"| {trained:,.0f} |"
            )
            curves[recipe].append((stage, mean, low, high))
    plot = args.out.with_suffix(".png")
    learning_curve(curves, plot)
    command = "python bench/efficacy.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    walltimes = ", ".join(f"{r} seed {s}: {w / 60:.1f} min" for (r, s), w in walls.items())
    report = [
        "# Efficacy: held-out success per stage, over seeds (`bench/efficacy.py`)",
        "",
        f"Command: `{command.strip()}` (`make bench-efficacy`). Date: "
        f"{datetime.now(UTC):%Y-%m-%d}. Machine: {os.cpu_count()} CPU cores, "
        f"{platform.machine()}, Python {platform.python_version()}.",
        f"Budget on top of the shipped configs: `{' '.join(BUDGET + args.set)}`; "
        + "; ".join(f"{r}: `{' '.join(recipe_budget(r, args.gpu))}`" for r in args.recipes)
        + ", "
        f"{args.rounds} rounds, seeds {seeds}. Wall time (a finished stage is served from "
        f"its manifest on a re-run, so a resumed run reads short): {walltimes}.",
        "",
        "| recipe | stage | mean success | 95% interval (bootstrap, seeds x tasks) "
        "| 95% interval (Wilson, pooled episodes) | solved | per seed | tokens trained |",
        "|---|---|---:|---|---|---:|---|---:|",
        *rows,
        "",
        f"![learning curve]({plot.name})",
        "",
        "Orderings per seed:",
        *orderings(per_seed, args.rounds),
        "",
    ]
    args.out.write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
