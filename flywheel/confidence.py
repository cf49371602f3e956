"""How sure a success rate is: the Wilson score interval, which stays inside [0, 1] and is
honest for the small n and the rates near 0 that agent evaluations have (4 of 26 solved reads
15.4% [6.2%, 33.5%]); and paired comparisons of two stages evaluated on the same tasks (the exact
McNemar test, a paired bootstrap interval of the difference, the tasks a difference needs)."""

from __future__ import annotations

import math
import random
import statistics

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The (low, high) 95% interval of a rate of `successes` in `n` trials; (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes in {n} trials")
    rate = successes / n
    spread = z * z / n
    centre = (rate + spread / 2) / (1 + spread)
    half = z * math.sqrt(rate * (1 - rate) / n + spread / (4 * n)) / (1 + spread)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends, no rounding dust
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


# Paired comparisons. Every stage of a run is evaluated on the same tasks, so two stages are
# compared task by task: a task one stage solves and the other does not is the evidence, and the
# tasks both solve (or both fail) say nothing about the difference. Two independent intervals
# ignore that pairing and are far less sensitive.


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: under "no difference" each of the `gained + lost`
    discordant tasks is a fair coin, so the p-value is twice the binomial tail of the smaller
    count (capped at 1). 7 gained, 1 lost: 2 * (1 + 8) / 2^8 = 0.0703125."""
    if gained < 0 or lost < 0:
        raise ValueError(f"negative counts: {gained} gained, {lost} lost")
    n = gained + lost
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1))
    return min(1.0, 2 * tail / 2**n)


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
    """As `paired_bootstrap`, pooled over runs (seeds) that evaluated the same tasks: each
    resample draws seeds with replacement and tasks with replacement (the same tasks for every
    drawn seed: seeds share tasks, so their episodes are not independent draws), and takes the
    mean of after minus before over the drawn (seed, task) cells."""
    if not pairs:
        raise ValueError("no runs to compare")
    tasks = sorted(set.intersection(*(set(b) & set(a) for b, a in pairs)))
    if not tasks:
        raise ValueError("the two stages share no task")
    differences = [{t: int(a[t]) - int(b[t]) for t in tasks} for b, a in pairs]
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        runs = [rng.choice(differences) for _ in differences]
        picked = [rng.choice(tasks) for _ in tasks]
        means.append(sum(run[t] for run in runs for t in picked) / (len(runs) * len(picked)))
    return _percentiles(means)


def paired_ratio_bootstrap(
    pairs: list[tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]],
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """95% percentile interval of a ratio of sums, after's minus before's, over (before, after)
    tables of task -> (numerator, denominator) (tool calls, correct answers) of the same tasks,
    one pair per seed: seeds and tasks resampled as in `paired_bootstrap_over_seeds`. A resample
    where either side's denominators sum to 0 has no ratio and is left out; the third value is
    the share of resamples left out (the interval is (nan, nan) when all are)."""
    if not pairs:
        raise ValueError("no runs to compare")
    tasks = sorted(set.intersection(*(set(b) & set(a) for b, a in pairs)))
    if not tasks:
        raise ValueError("the two stages share no task")
    rng = random.Random(seed)
    differences, undefined = [], 0
    for _ in range(resamples):
        runs = [rng.choice(pairs) for _ in pairs]
        picked = [rng.choice(tasks) for _ in tasks]
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
