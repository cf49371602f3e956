"""Run a command and report its wall time and the peak memory of its whole process tree.

    .venv/bin/python -m bench.measure_run -- make demo

Peak memory is the largest sum of resident set sizes over the command and all its descendants
(trainer subprocesses, vLLM's engine processes), sampled every `--interval` seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time

import psutil


def tree_rss(root: psutil.Process) -> int:
    total = 0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += process.memory_info().rss
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.5, help="sampling period, seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    started = time.perf_counter()
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_rss(root))
        time.sleep(args.interval)
    wall = time.perf_counter() - started
    print(
        f"\n| command | exit | wall time | peak memory (process tree RSS) |\n|---|---|---|---|\n"
        f"| `{' '.join(command)}` | {child.returncode} | {wall / 60:.1f} min ({wall:.0f} s) "
        f"| {peak / 2**30:.2f} GiB |",
        file=sys.stderr,
    )
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
