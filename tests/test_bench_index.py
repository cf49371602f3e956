"""bench/ is the benchmarks a user runs, each with a make target and a line in bench/README.md;
experiments/ holds the scripts that reproduce a docs claim, each listed with its claim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scripts(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")


def runnable(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


def make_targets_running(module: str) -> list[str]:
    """The Makefile targets whose recipe runs `module` (as `-m bench.x` or `bench/x.py`)."""
    targets, current = [], None
    dotted, slashed = module, module.replace(".", "/") + ".py"
    for line in (ROOT / "Makefile").read_text().splitlines():
        header = re.match(r"^([A-Za-z0-9_-]+):", line)
        if header:
            current = header.group(1)
        elif (
            line.startswith("\t")
            and current
            and re.search(rf"(-m {re.escape(dotted)}\b|{re.escape(slashed)})", line)
        ):
            targets.append(current)
    return targets


def test_every_bench_script_is_listed_in_the_bench_index():
    index = (ROOT / "bench" / "README.md").read_text()
    missing = [p.name for p in scripts("bench") if f"`{p.name}`" not in index]
    assert not missing, f"bench/README.md does not list {missing}"


def test_every_runnable_bench_has_a_make_target_named_in_the_index():
    index = (ROOT / "bench" / "README.md").read_text()
    shared = {"trl_every_position.py"}  # a trainer wrapper train_throughput runs, not a bench
    for path in scripts("bench"):
        if not runnable(path) or path.name in shared:
            continue
        targets = make_targets_running(f"bench.{path.stem}")
        assert targets, f"bench/{path.name} has no make target"
        assert any(f"`make {t}`" in index for t in targets), (
            f"bench/README.md does not name bench/{path.name}'s target {targets}"
        )


def test_every_experiment_is_listed_with_its_claim():
    index = (ROOT / "experiments" / "README.md").read_text()
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+\.py)` \| ([^|]+)\|", index, re.M)
    }
    for path in scripts("experiments"):
        assert path.name in rows, f"experiments/README.md does not list {path.name}"
        assert len(rows[path.name].split()) >= 5, f"{path.name}'s claim is not stated"
