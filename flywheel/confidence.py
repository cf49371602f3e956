"""How sure a success rate is: the Wilson score interval, which stays inside [0, 1] and is
honest for the small n and the rates near 0 that agent evaluations have (4 of 26 solved reads
15.4% [6.2%, 33.5%]); and paired comparisons of two stages evaluated on the same tasks (the exact
McNemar test, a paired bootstrap interval of the difference, the tasks a difference needs).
scipy computes the interval and the test; tests/test_confidence.py holds them to hand-computed
values."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterator, Sequence
from typing import TypeVar

from scipy.stats import binomtest


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The (low, high) interval of a rate of `successes` in `n` trials; (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes in {n} trials")
    interval = binomtest(successes, n).proportion_ci(confidence, method="wilson")
    return float(interval.low), float(interval.high)


# Paired comparisons. Every stage of a run is evaluated on the same tasks, so two stages are
# compared task by task: a task one stage solves and the other does not is the evidence, and the
# tasks both solve (or both fail) say nothing about the difference. Two independent intervals
# ignore that pairing and are far less sensitive.


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: under "no difference" each of the `gained + lost`
    discordant tasks is a fair coin, so it is the binomial test of `gained` heads in that many
    tosses. 7 gained, 1 lost: 2 * (1 + 8) / 2^8 = 0.0703125."""
    if gained < 0 or lost < 0:
        raise ValueError(f"negative counts: {gained} gained, {lost} lost")
    if gained + lost == 0:
        return 1.0  # no discordant task: no evidence (scipy refuses zero trials)
    return float(binomtest(gained, gained + lost, 0.5).pvalue)


def gained_and_lost(before: dict[str, bool], after: dict[str, bool]) -> tuple[int, int]:
    """Tasks `after` solves that `before` did not, and the reverse, over the tasks both read."""
    shared = before.keys() & after.keys()
    gained = sum(after[t] and not before[t] for t in shared)
    lost = sum(before[t] and not after[t] for t in shared)
    return gained, lost


def _percentiles(values: list[float]) -> tuple[float, float]:
    """The 2.5% and 97.5% percentiles of `values` (sorted here), as the resamples' order
    statistics: no interpolation, so a point mass gives a point."""
    values = sorted(values)
    n = len(values)
    return values[int(0.025 * n)], values[max(int(0.975 * n) - 1, 0)]


def paired_bootstrap(
    before: dict[str, bool], after: dict[str, bool], resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of the difference in success rate, after minus before, from a
    bootstrap over tasks: each resample draws tasks with replacement and keeps both stages'
    outcomes on a drawn task together (the pairing)."""
    return paired_bootstrap_over_seeds([(before, after)], resamples, seed)


def paired_bootstrap_over_seeds(
    pairs: list[tuple[dict[str, bool], dict[str, bool]]],
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """As `paired_bootstrap`, pooled over runs (seeds) that evaluated the same tasks: the
    `seed_task_bootstrap` interval of after minus before, task by task."""
    if not pairs:
        raise ValueError("no runs to compare")
    tasks = shared_tasks(pairs)
    differences = [{t: int(a[t]) - int(b[t]) for t in tasks} for b, a in pairs]
    return seed_task_bootstrap(differences, resamples, seed)


def seed_task_bootstrap(
    rows: list[dict[str, float]], resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of the mean of `rows` (one per seed: task -> value, every row on
    the same tasks) over seeds and tasks, both resampled (`resampled`). The one bootstrap of a
    success rate (rows of outcomes) and of a paired difference (rows of after minus before)."""
    tasks = sorted(rows[0])
    means = [
        sum(row[t] for row in drawn for t in picked) / (len(drawn) * len(picked))
        for drawn, picked in resampled(rows, tasks, resamples, seed)
    ]
    return _percentiles(means)


Row = TypeVar("Row")


def resampled(
    rows: Sequence[Row], tasks: list[str], resamples: int, seed: int
) -> Iterator[tuple[list[Row], list[str]]]:
    """Each resample's seeds (`rows` drawn with replacement) and tasks (drawn with replacement,
    the same for every drawn seed: seeds share tasks, so their episodes are not independent
    draws). Seeded: the same seed draws the same resamples."""
    rng = random.Random(seed)
    for _ in range(resamples):
        yield [rng.choice(rows) for _ in rows], [rng.choice(tasks) for _ in tasks]


def shared_tasks(pairs: list[tuple[dict, dict]]) -> list[str]:
    """The tasks every (before, after) table of `pairs` read, in order; refused when none."""
    tasks = sorted(set.intersection(*(set(b) & set(a) for b, a in pairs)))
    if not tasks:
        raise ValueError("the two stages share no task")
    return tasks


def paired_ratio_bootstrap(
    pairs: list[tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]],
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """95% percentile interval of a ratio of sums, after's minus before's, over (before, after)
    tables of task -> (numerator, denominator) (tool calls, correct answers) of the same tasks,
    one pair per seed: seeds and tasks resampled as in `seed_task_bootstrap`. A resample
    where either side's denominators sum to 0 has no ratio and is left out; the third value is
    the share of resamples left out (the interval is (nan, nan) when all are)."""
    if not pairs:
        raise ValueError("no runs to compare")
    differences, undefined = [], 0
    for runs, picked in resampled(pairs, shared_tasks(pairs), resamples, seed):
        sums = [
            [sum(side[t][i] for side in sides for t in picked) for i in (0, 1)]
            for sides in ([b for b, _ in runs], [a for _, a in runs])
        ]
        if sums[0][1] == 0 or sums[1][1] == 0:
            undefined += 1
            continue
        differences.append(sums[1][0] / sums[1][1] - sums[0][0] / sums[0][1])
    low, high = _percentiles(differences) if differences else (math.nan, math.nan)
    return low, high, undefined / resamples


def paired_comparison(
    pairs: list[tuple[dict[str, bool], dict[str, bool]]], resamples: int = 2000, seed: int = 0
) -> dict:
    """Before against after over (before, after) outcome tables of the same tasks (one per seed
    or sample): the cells both read, the cells gained and lost, the difference in success rate
    over those cells, its paired bootstrap 95% interval (`paired_bootstrap_over_seeds`) and the
    exact McNemar p on the pooled discordant cells (which treats cells as independent; the
    bootstrap does not)."""
    counts = [gained_and_lost(before, after) for before, after in pairs]
    gained, lost = sum(g for g, _ in counts), sum(x for _, x in counts)
    cells = sum(len(before.keys() & after.keys()) for before, after in pairs)
    low, high = paired_bootstrap_over_seeds(pairs, resamples, seed)
    return {
        "cells": cells, "gained": gained, "lost": lost, "difference": (gained - lost) / cells,
        "low": low, "high": high, "p": mcnemar_exact(gained, lost),
    }  # fmt: skip


def mcnemar_tasks_needed(
    discordant: float, difference: float, alpha: float = 0.05, power: float = 0.8
) -> int:
    """Paired tasks a two-sided McNemar test at level `alpha` needs to detect a difference
    `difference` (gained share minus lost share) with probability `power`, when a share
    `discordant` of tasks (gained plus lost) differ between the stages (Connor 1987, the normal
    approximation): n = (z_a * sqrt(d) + z_b * sqrt(d - diff^2))^2 / diff^2."""
    if not 0 < abs(difference) <= discordant <= 1:
        raise ValueError(f"need 0 < |difference| <= discordant <= 1: {difference}, {discordant}")
    normal = statistics.NormalDist()
    z_alpha, z_beta = normal.inv_cdf(1 - alpha / 2), normal.inv_cdf(power)
    root = z_alpha * math.sqrt(discordant) + z_beta * math.sqrt(discordant - difference**2)
    return math.ceil(root**2 / difference**2)
