"""Mutation score per module from a finished `mutmut run` (its mutants/*.meta files).

score = killed / (mutants checked), where "checked" leaves out mutants not run (a narrowed run)
and counts survivors, mutants no test reaches and timeouts against the score. Timeouts are listed
apart: a mutant that makes a loop run forever is killed in spirit, but it is slow evidence.
Usage: python scripts/mutation_scores.py [mutants folder]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KILLED = {1, 3, 37}  # a failing test, pytest's internal error, the type checker
TIMEOUT = {36, 24, -24, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


def main(folder: str = "mutants") -> int:
    rows = []
    for meta in sorted(Path(folder).rglob("*.py.meta")):
        codes = list(json.loads(meta.read_text())["exit_code_by_key"].values())
        checked = [c for c in codes if c is not None and c != 34]  # 34: skipped
        if not checked:
            continue
        killed = sum(c in KILLED for c in checked)
        rows.append(
            (
                str(meta.relative_to(folder)).removesuffix(".meta"),
                len(checked),
                killed,
                sum(c in SURVIVED for c in checked),
                sum(c in NO_TESTS for c in checked),
                sum(c in TIMEOUT for c in checked),
            )
        )
    if not rows:
        print(f"no finished mutants under {folder}/")
        return 1
    print("| module | mutants | killed | survived | no tests | timeout | score |")
    print("|---|---|---|---|---|---|---|")
    for module, total, killed, survived, no_tests, timeout in rows:
        print(
            f"| {module} | {total} | {killed} | {survived} | {no_tests} | {timeout} "
            f"| {killed / total:.0%} |"
        )
    total = sum(r[1] for r in rows)
    killed = sum(r[2] for r in rows)
    print(f"| all | {total} | {killed} | | | | {killed / total:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
