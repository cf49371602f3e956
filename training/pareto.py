"""ET-Agent's group-wise Pareto sampling: which questions' rollout groups an RL step trains on.

A group is the K rollouts of one question under the current policy. A group teaches the policy
something only where its rollouts differ, so each group gets two objectives, both maximised:

- the variance of its tool-call counts (the rollouts behave differently), and
- the variance of its correctness (some rollouts are right, some wrong).

Selection under a budget of k groups (NSGA-II's survivor selection, applied to groups):

1. `non_dominated_fronts`: front 1 is every group no other group dominates, front 2 what
   dominates is left once front 1 is taken away, and so on.
2. Whole fronts are taken while they fit in the budget.
3. The first front that does not fit is cut by `crowding_distance`: the groups standing most
   apart from their neighbours on the front are kept, so the selection spans the front instead
   of bunching on one part of it.
4. `mixed_groups`: of the selected groups only those with both a success and a failure are kept;
   a group all right or all wrong has nothing to compare (its GRPO advantages are all zero). This
   comes after the budget, as the paper orders it, so fewer than k groups may remain.

Readings where the paper leaves a choice (tests pin each one):

- Variances are population variances (divide by K, not K - 1), as `numpy.var` computes them;
  with equal K per group the choice changes no ranking.
- Ties in crowding distance: within one front, sorting by an objective is stable (equal values
  keep their original order). The first and the last point of that order are the boundary
  points and get an infinite distance; the others add (next value - previous value) / (the
  front's range on that objective). An objective on which the whole front is equal adds nothing
  to anyone: no point is more of a boundary than another. When the last front is cut, larger
  distances go first and equal distances (infinite ones included) go in the original order of
  the groups, so a selection never depends on anything but its input.
- A rollout is a success when its correctness is above `success_threshold` (default 0.8: the
  issue's token-F1 > 0.8 for QA; binary 0/1 correctness works with any threshold in [0, 1)).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field, model_validator

Point = Sequence[float]

SUCCESS_THRESHOLD = 0.8


def dominates(a: Point, b: Point) -> bool:
    """Whether `a` Pareto-dominates `b` with every objective maximised: no worse on any objective
    and better on at least one. Equal points dominate neither way."""
    if len(a) != len(b):
        raise ValueError(f"points of different sizes: {len(a)} and {len(b)}")
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(
        x > y for x, y in zip(a, b, strict=True)
    )


def non_dominated_fronts(points: Sequence[Point]) -> list[list[int]]:
    """The indices of `points` in non-dominated fronts, best front first, each front in the
    original order. Every index is in exactly one front; identical points share a front."""
    n = len(points)
    beaten_by = [0] * n  # how many points dominate i
    beats: list[list[int]] = [[] for _ in range(n)]  # the points i dominates
    for i in range(n):
        for j in range(n):
            if i != j and dominates(points[i], points[j]):
                beats[i].append(j)
                beaten_by[j] += 1
    fronts = []
    current = [i for i in range(n) if beaten_by[i] == 0]
    while current:
        fronts.append(current)
        following = []
        for i in current:
            for j in beats[i]:
                beaten_by[j] -= 1
                if beaten_by[j] == 0:
                    following.append(j)
        current = sorted(following)
    return fronts


def crowding_distance(points: Sequence[Point]) -> list[float]:
    """NSGA-II's crowding distance of each point of one front (see the module docstring for
    ties): per objective, the gap between a point's two neighbours divided by the front's range,
    summed over objectives; the boundary points of each objective get infinity."""
    n = len(points)
    distances = [0.0] * n
    if n == 0:
        return distances
    for objective in range(len(points[0])):
        order = sorted(range(n), key=lambda i: points[i][objective])  # stable: ties keep order
        low, high = points[order[0]][objective], points[order[-1]][objective]
        span = high - low
        if span == 0:
            continue
        distances[order[0]] = distances[order[-1]] = math.inf
        for position in range(1, n - 1):
            before = points[order[position - 1]][objective]
            after = points[order[position + 1]][objective]
            distances[order[position]] += (after - before) / span
    return distances


def crowding_order(points: Sequence[Point]) -> list[int]:
    """The indices of one front's points, most isolated first: larger crowding distance first,
    equal distances in the original order."""
    distances = crowding_distance(points)
    return sorted(range(len(points)), key=lambda i: (-distances[i], i))


def pareto_select(points: Sequence[Point], k: int) -> list[int]:
    """The indices of at most `k` points: whole fronts while they fit, then the first front
    that does not fit cut by crowding distance. Returned in the original order."""
    if k < 0:
        raise ValueError(f"a budget of {k} points")
    chosen: list[int] = []
    for front in non_dominated_fronts(points):
        room = k - len(chosen)
        if room <= 0:
            break
        if len(front) <= room:
            chosen += front
        else:
            ranked = crowding_order([points[i] for i in front])
            chosen += [front[i] for i in ranked[:room]]
    return sorted(chosen)


def is_mixed(correctness: Sequence[float], success_threshold: float = SUCCESS_THRESHOLD) -> bool:
    """Whether a group has both a success (correctness > threshold) and a failure."""
    successes = [c > success_threshold for c in correctness]
    return any(successes) and not all(successes)


def mixed_groups(
    correctness: Sequence[Sequence[float]], success_threshold: float = SUCCESS_THRESHOLD
) -> list[int]:
    """The indices of the groups with both successes and failures."""
    return [i for i, group in enumerate(correctness) if is_mixed(group, success_threshold)]


def mixed_group_ids(outcomes: Iterable[tuple[str | None, bool]]) -> set[str]:
    """The ids of the groups holding both a success and a failure, from one (group id, success)
    per rollout; a rollout without a group id belongs to no group. The RL trainer's filter
    (`rl.groups: mixed`) and the sample stages' share of such groups both count by this."""
    outcomes_of: dict[str, set[bool]] = {}
    for group, success in outcomes:
        if group is not None:
            outcomes_of.setdefault(group, set()).add(success)
    return {group for group, seen in outcomes_of.items() if len(seen) == 2}


def variance(values: Sequence[float]) -> float:
    """Population variance (divide by the count); 0 for an empty sequence."""
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


# ---- groups of rollouts, as a stage reads them ---------------------------------------------------


class RolloutGroup(BaseModel):
    """The K rollouts of one question: each rollout's correctness (0..1) and tool calls."""

    group_id: str
    correctness: list[float]
    tool_calls: list[int]

    @model_validator(mode="after")
    def _rollouts_line_up(self) -> RolloutGroup:
        if not self.correctness:
            raise ValueError(f"group {self.group_id!r} has no rollouts")
        if len(self.correctness) != len(self.tool_calls):
            raise ValueError(
                f"group {self.group_id!r}: {len(self.correctness)} correctness values and "
                f"{len(self.tool_calls)} tool-call counts"
            )
        if any(not 0.0 <= c <= 1.0 for c in self.correctness):
            raise ValueError(f"group {self.group_id!r}: correctness outside [0, 1]")
        if any(t < 0 for t in self.tool_calls):
            raise ValueError(f"group {self.group_id!r}: a negative tool-call count")
        return self

    @property
    def objectives(self) -> tuple[float, float]:
        """(variance of tool calls, variance of correctness), both maximised."""
        return variance([float(t) for t in self.tool_calls]), variance(self.correctness)


class GroupSelection(BaseModel):
    """Which groups an RL step trains on, and why each group was kept or dropped."""

    kept: list[str]  # in the input order
    dropped: list[str]
    reasons: dict[str, str] = Field(default_factory=dict)  # every group id -> why
    fronts: list[list[str]] = Field(default_factory=list)  # the non-dominated fronts, by id


def select_groups(
    groups: Sequence[RolloutGroup],
    budget: int,
    success_threshold: float = SUCCESS_THRESHOLD,
) -> GroupSelection:
    """ET-Agent's group-wise Pareto sampling: at most `budget` groups by non-dominated sort and
    crowding distance on (variance of tool calls, variance of correctness), then only those with
    both successes and failures. Every group gets a reason a person can read."""
    ids = [g.group_id for g in groups]
    if len(set(ids)) != len(ids):
        raise ValueError("group ids repeat")
    if budget < 0:
        raise ValueError(f"a budget of {budget} groups")
    points = [g.objectives for g in groups]
    fronts = non_dominated_fronts(points)
    selected = set(pareto_select(points, budget))
    reasons: dict[str, str] = {}
    taken = 0  # places used by the fronts before the current one
    for number, front in enumerate(fronts, start=1):
        where = f"front {number} of {len(fronts)}"
        distances = crowding_distance([points[i] for i in front])
        cut = taken < budget < taken + len(front)
        for i, distance in zip(front, distances, strict=True):
            tools, right = points[i]
            values = f"tool-call variance {tools:.4g}, correctness variance {right:.4g}"
            if i in selected:
                why = f"{where} ({values})"
                if cut:
                    why += f"; kept on crowding distance {distance:.4g} when the front was cut"
            elif taken >= budget:
                why = f"dropped: {where} ({values}); the budget of {budget} was filled by the fronts before it"
            else:
                why = (
                    f"dropped: {where} ({values}); crowding distance {distance:.4g}: the front "
                    f"had {len(front)} groups for {budget - taken} places left"
                )
            reasons[ids[i]] = why
        taken += len(front)
    kept = []
    for i, group in enumerate(groups):
        if i not in selected:
            continue
        if is_mixed(group.correctness, success_threshold):
            kept.append(group.group_id)
            reasons[group.group_id] = f"kept: {reasons[group.group_id]}; mixed results"
        else:
            outcome = "succeeded" if group.correctness[0] > success_threshold else "failed"
            reasons[group.group_id] = (
                f"dropped: {reasons[group.group_id]}; but all {len(group.correctness)} rollouts "
                f"{outcome} (success: correctness > {success_threshold}), nothing to compare"
            )
    return GroupSelection(
        kept=kept,
        dropped=[g for g in ids if g not in kept],
        reasons=reasons,
        fronts=[[ids[i] for i in front] for front in fronts],
    )
