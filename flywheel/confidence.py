"""How sure a success rate is: the Wilson score interval, which stays inside [0, 1] and is
honest for the small n and the rates near 0 that agent evaluations have (4 of 26 solved reads
15.4% [6.2%, 33.5%])."""

from __future__ import annotations

import math

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
