"""ET-Agent's efficiency reward for behaviour-calibration RL, and the decay of its sharpness.

    r = correctness * f_tool * f_length + f_format

    f_tool   = 2 / (1 + exp(sigma_tool * (T - mean T)))        T: the rollout's tool calls
    f_length = 2 / (1 + exp(sigma_length * z))                z: its length, z-scored in the group
    f_format = -1 if the rollout's format is invalid, else 0

Both factors are 1 for a rollout at its group's mean, approach 2 for one far below it and 0 for
one far above: a right answer reached with fewer calls and fewer tokens than its siblings earns
up to 4 times the reward of a plain right answer, one reached with more earns less, and a wrong
answer earns nothing however it behaved (only the format term can still cost it). Groups are the
K rollouts of one question, as in `training.pareto`.

Readings where the paper leaves a choice (tests pin each one):

- The means are over the whole group, right and wrong rollouts alike.
- f_tool takes the raw deviation in calls (one call more or less is a fixed step, whatever the
  group), f_length the z-score (lengths run to thousands of tokens; the z-score puts them on
  the scale of a few units, so one sigma serves every question). The z-score divides by the
  population standard deviation (divide by K). A group whose lengths are all equal has no
  spread to score: every z is 0 and f_length is 1.
- The formula is applied as written: an invalid format adds -1 to whatever the rest gives. The
  caller decides what correctness an ill-formatted rollout has (the QA environment gives it none,
  so it ends at -1).
- Curriculum: within a stage sigma falls linearly from its initial value at step 0 to 0 at
  `total_steps`, the number of optimiser steps the stage takes: `decayed_sigma(s, step, total)`
  = s * (1 - step / total), and 0 from `total` on. Step `total - 1`, the stage's last update,
  still has s / total. At sigma 0 both factors are 1 and the reward is correctness + f_format.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SIGMA_TOOL = 0.2
SIGMA_LENGTH = 0.5


def shaping(x: float, sigma: float) -> float:
    """2 / (1 + exp(sigma * x)): 1 at x = 0, falling from 2 to 0 as x grows (for sigma > 0)."""
    exponent = sigma * x
    if exponent > 700:  # exp overflows a float beyond ~709; the value is 0 to double precision
        return 0.0
    return 2.0 / (1.0 + math.exp(exponent))


def deviations(values: Sequence[float]) -> list[float]:
    """Each value minus the mean of all of them."""
    mean = sum(values) / len(values)
    return [v - mean for v in values]


def z_scores(values: Sequence[float]) -> list[float]:
    """(value - mean) / population std; all 0 when the values are all equal."""
    centred = deviations(values)
    std = math.sqrt(sum(d * d for d in centred) / len(centred))
    if std == 0:
        return [0.0] * len(centred)
    return [d / std for d in centred]


def tool_factors(tool_calls: Sequence[int], sigma_tool: float = SIGMA_TOOL) -> list[float]:
    """f_tool of each rollout of one group."""
    return [shaping(d, sigma_tool) for d in deviations([float(t) for t in tool_calls])]


def length_factors(lengths: Sequence[int], sigma_length: float = SIGMA_LENGTH) -> list[float]:
    """f_length of each rollout of one group, on its z-scored response length."""
    return [shaping(z, sigma_length) for z in z_scores([float(n) for n in lengths])]


def format_term(format_valid: bool) -> float:
    return 0.0 if format_valid else -1.0


def efficiency_rewards(
    correctness: Sequence[float],
    tool_calls: Sequence[int],
    lengths: Sequence[int],
    format_valid: Sequence[bool],
    sigma_tool: float = SIGMA_TOOL,
    sigma_length: float = SIGMA_LENGTH,
) -> list[float]:
    """The reward of each rollout of one group (one question's K rollouts)."""
    n = len(correctness)
    if not n:
        raise ValueError("an empty group")
    if not len(tool_calls) == len(lengths) == len(format_valid) == n:
        raise ValueError("the group's lists have different lengths")
    if sigma_tool < 0 or sigma_length < 0:
        raise ValueError("a negative sigma would reward more calls and longer replies")
    tools = tool_factors(tool_calls, sigma_tool)
    length = length_factors(lengths, sigma_length)
    return [
        c * t * ln + format_term(ok)
        for c, t, ln, ok in zip(correctness, tools, length, format_valid, strict=True)
    ]


def decayed_sigma(initial: float, step: int, total_steps: int) -> float:
    """Sigma at optimiser step `step` (0-based) of a curriculum stage of `total_steps` steps:
    `initial` at step 0, falling linearly to 0 at `total_steps`, and 0 after."""
    if total_steps <= 0:
        raise ValueError(f"a stage of {total_steps} steps")
    if step < 0:
        raise ValueError(f"step {step}")
    return initial * max(0.0, 1.0 - step / total_steps)
