"""The python tool's cost in each box: the namespace box (the default) against the audit-hook box.

Two measurements, both through `envs.tools.PythonTool`, as the QA environment calls it:

latency: one call after another (`execute`), the boxes alternating call by call so that both
    see the same machine load; median, p95 and mean milliseconds a call, from the parent's
    side (the temporary folder, the process start, the code, the teardown), and the CPU
    milliseconds a call cost the processes it started (getrusage of the waited-for children:
    less dependent on the machine's load than wall time).
throughput: the RL sampler's way: `QAEnv.step_all` hands every live episode's python call of a
    step to one `execute_batch`, which runs them on `ToolSettings.workers` threads (2 by default);
    a batch of `--batch` calls per (box, workers), `--rounds` times: calls per second (median
    over the rounds).

The code is an arithmetic step like the scripted solver's (`envs.qa_env`), which costs what
`print(1)` costs; a call's time is the box's. Results go to `--out` (markdown), with the
machine's load average before and after, since other work on the machine slows both boxes.

    python -m bench.sandbox_latency                      # ~1 min on 2 cores
    python -m bench.sandbox_latency --calls 200 --workers 1 2 4 8
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from envs.sandbox import SandboxLimits
from envs.tools import PythonTool, ToolSettings

ROOT = Path(__file__).resolve().parents[1]

BOXES = ("namespaces", "audit-hooks")
CALL = {"code": "years = 1912 - 1887\nprint(years * 2)"}
EXPECTED = "50"


def tool(isolation: str, workers: int = 2) -> PythonTool:
    return PythonTool(ToolSettings(workers=workers), SandboxLimits(isolation=isolation))


def checked(output: str) -> None:
    if output != EXPECTED:
        raise RuntimeError(f"the sandbox printed {output!r}, not {EXPECTED!r}")


def children_cpu_s() -> float:
    """CPU seconds (user + system) of the processes this one has waited for, theirs included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def latencies(calls: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per box: the calls' wall seconds, and the CPU seconds a call cost on average (the
    launcher's, the box's and the code's: less dependent on the machine's load)."""
    tools = {isolation: tool(isolation) for isolation in BOXES}
    for python in tools.values():  # warm the interpreter's files in the page cache
        checked(python.execute(CALL))
    seconds: dict[str, list[float]] = {isolation: [] for isolation in BOXES}
    cpu = dict.fromkeys(BOXES, 0.0)
    for _ in range(calls):
        for isolation, python in tools.items():
            started, cpu_before = time.perf_counter(), children_cpu_s()
            checked(python.execute(CALL))
            seconds[isolation].append(time.perf_counter() - started)
            cpu[isolation] += children_cpu_s() - cpu_before
    return seconds, {isolation: total / calls for isolation, total in cpu.items()}


def throughput(batch: int, workers: int, rounds: int) -> dict[str, float]:
    """Calls per second of one execute_batch of `batch` calls, median over `rounds`."""
    rates: dict[str, list[float]] = {isolation: [] for isolation in BOXES}
    for _ in range(rounds):
        for isolation in BOXES:
            python = tool(isolation, workers)
            started = time.perf_counter()
            for output in python.execute_batch([CALL] * batch):
                checked(output)
            rates[isolation].append(batch / (time.perf_counter() - started))
    return {isolation: statistics.median(r) for isolation, r in rates.items()}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def report(args, seconds, cpu, rates, load_before, load_after) -> str:
    lines = [
        f"# The python tool's sandbox: latency and batch throughput ({datetime.now(UTC):%Y-%m-%d})",
        "",
        f"`python -m bench.sandbox_latency {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"Machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
        f"{platform.python_version()}, running as uid {os.getuid()}; load average "
        f"{load_before:.2f} before, {load_after:.2f} after (other work shares the machine).",
        "",
        f"Latency: {args.calls} calls a box, one after another, the boxes alternating.",
        "",
        "| box | median ms | p95 ms | mean ms | CPU ms a call |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for isolation in BOXES:
        values = [s * 1000 for s in seconds[isolation]]
        lines.append(
            f"| {isolation} | {statistics.median(values):.1f} | {percentile(values, 0.95):.1f} "
            f"| {statistics.mean(values):.1f} | {cpu[isolation] * 1000:.1f} |"
        )
    lines += [
        "",
        f"Throughput: one `execute_batch` of {args.batch} calls (the RL sampler's way), median "
        f"of {args.rounds} rounds.",
        "",
        "| workers | " + " | ".join(f"{b} calls/s" for b in BOXES) + " |",
        "| ---: | " + " | ".join("---:" for _ in BOXES) + " |",
    ]
    for workers, rate in rates.items():
        lines.append(f"| {workers} | " + " | ".join(f"{rate[b]:.1f}" for b in BOXES) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="latency calls per box")
    parser.add_argument("--batch", type=int, default=32, help="calls in one execute_batch")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results-sandbox-latency.md")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    seconds, cpu = latencies(args.calls)
    rates = {w: throughput(args.batch, w, args.rounds) for w in args.workers}
    text = report(args, seconds, cpu, rates, load_before, os.getloadavg()[0])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
