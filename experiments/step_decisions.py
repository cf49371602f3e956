"""What a round's step pairs teach at each decision, pooled over runs (seeds): for each state (the
calls made so far, `search search`) the pairs' votes, move chosen over move rejected, per
question family and over all families, and each move's net vote (times chosen less times
rejected).

    python -m experiments.step_decisions runs/issue66-eto-qa/efficacy-eto-seed{0,1}

A decision that several families share (after two lookups: answer, or python?) with pairs
tilted one way over all families is where a round can carry one family's move to the others
(docs/notebook.md, issue 66's candidate 6: seed 1's pairs voted answer +13, python +1 after two
lookups, and the round answered there in every family, losing 14 tasks that need python).
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from bench.run_files import read_records
from experiments.family_moves import call, family
from flywheel.records import Pair


def state(pair: Pair) -> str:
    """The calls the episode made before the pair's step: the prompt's last `step` (0-based)
    assistant turns; any before them belong to the worked example."""
    replies = [m for m in pair.prompt if m.role == "assistant"]
    return " ".join(call(m) for m in replies[len(replies) - (pair.step or 0) :]) or "(start)"


def votes(pairs: list[Pair]) -> dict[str, dict[str, Counter]]:
    """state -> family (and "all") -> Counter of (chosen move, rejected move); pairs whose two
    sides call the same tool (a different query, a different sum) vote for neither move."""
    table: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for pair in pairs:
        chosen, rejected = call(pair.chosen[0]), call(pair.rejected[0])
        if chosen == rejected:
            continue
        for group in (family(pair.task_id), "all"):
            table[state(pair)][group][(chosen, rejected)] += 1
    return table


def net(counts: Counter) -> Counter:
    """Each move's times chosen less times rejected."""
    total: Counter = Counter()
    for (chosen, rejected), n in counts.items():
        total[chosen] += n
        total[rejected] -= n
    return total


def read_pairs(run: Path, round_: int) -> list[Pair]:
    path = run / f"round-{round_}" / "step-pairs" / "pairs.jsonl"
    if not path.exists():
        raise SystemExit(f"no step pairs at {path} (a run with explore.level=step?)")
    return list(read_records(path, Pair))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (storage_url/run_name)")
    parser.add_argument("--round", type=int, default=1, dest="round_")
    args = parser.parse_args(argv)
    pairs = [p for run in args.runs for p in read_pairs(run, args.round_)]
    print("| state (calls so far) | family | pairs: chosen > rejected | net vote per move |")
    print("|---|---|---|---|")
    for where, groups in sorted(votes(pairs).items()):
        for group in sorted(groups, key=lambda g: (g == "all", g)):
            counts = groups[group]
            shown = ", ".join(f"{c} > {r} ×{n}" for (c, r), n in sorted(counts.items()))
            moves = ", ".join(f"{m} {v:+d}" for m, v in sorted(net(counts).items()))
            name = f"**{group}**" if group == "all" else group
            print(f"| {where} | {name} | {shown} | {moves} |")


if __name__ == "__main__":
    main()
