"""Mutation score per module from a finished `mutmut run` (its mutants/*.meta files).

score = killed / (mutants checked - equivalent), where "checked" leaves out mutants not run (a
narrowed run; "generated" counts them all) and counts survivors, mutants no test reaches and timeouts against the score.
"equivalent" are survivors named in tests/mutation_equivalents.md (a line "- `MUTANT_NAME`: why"):
mutants no test can tell from the original; only those are discounted, and only while they
survive (a listed mutant that a test kills counts as killed). Timeouts are listed apart: a mutant
that makes a loop run forever is killed in spirit, but it is slow evidence.
Usage: python scripts/mutation_scores.py [mutants folder] [equivalents list]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

KILLED = {1, 3, 37}  # a failing test, pytest's internal error, the type checker
TIMEOUT = {36, 24, -24, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}
EQUIVALENTS = Path(__file__).resolve().parent.parent / "tests" / "mutation_equivalents.md"
NAMED = re.compile(r"^- `([\w.ǁ]+__mutmut_\d+)`", re.MULTILINE)


def equivalent_names(path: Path = EQUIVALENTS) -> set[str]:
    """Mutant names listed as equivalent, one per line: "- `name`: reason"."""
    return set(NAMED.findall(path.read_text())) if path.exists() else set()


def main(folder: str = "mutants", equivalents: str | None = None) -> int:
    listed = equivalent_names(Path(equivalents) if equivalents else EQUIVALENTS)
    rows = []
    for meta in sorted(Path(folder).rglob("*.py.meta")):
        results = json.loads(meta.read_text())["exit_code_by_key"]
        checked = {k: c for k, c in results.items() if c is not None and c != 34}  # 34: skipped
        if not checked:
            continue
        equivalent = sum(c in SURVIVED for k, c in checked.items() if k in listed)
        codes = [c for k, c in checked.items() if not (k in listed and c in SURVIVED)]
        rows.append(
            (
                str(meta.relative_to(folder)).removesuffix(".meta"),
                len(codes),
                sum(c in KILLED for c in codes),
                sum(c in SURVIVED for c in codes),
                sum(c in NO_TESTS for c in codes),
                sum(c in TIMEOUT for c in codes),
                equivalent,
                len(results),
            )
        )
    if not rows:
        print(f"no finished mutants under {folder}/")
        return 1
    print(
        "| module | generated | mutants | killed | survived | no tests | timeout | equivalent "
        "| score |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for module, total, killed, survived, no_tests, timeout, equivalent, generated in rows:
        print(
            f"| {module} | {generated} | {total} | {killed} | {survived} | {no_tests} | {timeout} "
            f"| {equivalent} | {killed / total:.0%} |"
        )
    total = sum(r[1] for r in rows)
    killed = sum(r[2] for r in rows)
    equivalent = sum(r[6] for r in rows)
    generated = sum(r[7] for r in rows)
    print(f"| all | {generated} | {total} | {killed} | | | | {equivalent} | {killed / total:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
