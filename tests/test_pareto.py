"""Group-wise Pareto sampling against fronts and crowding distances worked out by hand on small
drawn point sets, the tie rules pinned, and the mixed-result filter."""

from __future__ import annotations

import math

import pytest

from training.pareto import (
    RolloutGroup,
    crowding_distance,
    crowding_order,
    dominates,
    is_mixed,
    mixed_groups,
    non_dominated_fronts,
    pareto_select,
    select_groups,
    variance,
)

INF = math.inf


def test_dominance_is_about_maximising_both():
    assert dominates((2, 3), (1, 3))  # better on one, equal on the other
    assert dominates((2, 3), (1, 1))
    assert not dominates((1, 3), (2, 3))  # the other way round
    assert not dominates((1, 1), (2, 3))


def test_incomparable_and_equal_points_dominate_neither_way():
    assert not dominates((1, 3), (3, 1)) and not dominates((3, 1), (1, 3))
    assert not dominates((2, 2), (2, 2))


def test_points_of_different_sizes_are_refused():
    with pytest.raises(ValueError):
        dominates((1, 2), (1, 2, 3))


# A hand-drawn set (x right, y up):
#
#  y 4 |  a . . . .     front 1: a b e c (nothing beats them: e(3,1) would need a point with
#    3 |  . . b . .              x >= 3 and y >= 1, and c(4,0) has y 0)
#    2 |  . d . . .     front 2: d (beaten by b only)
#    1 |  . f . e .     front 3: f (beaten by b, d, e)
#    0 |  g . . . c     front 4: g (beaten by everyone)
#        0 1 2 3 4  x
POINTS = [(0, 4), (2, 3), (4, 0), (1, 2), (3, 1), (1, 1), (0, 0)]
A, B, C, D, E, F, G = range(7)


def test_fronts_of_a_hand_drawn_set():
    assert non_dominated_fronts(POINTS) == [[A, B, C, E], [D], [F], [G]]


def test_fronts_put_identical_points_together():
    assert non_dominated_fronts([(1, 1), (2, 2), (1, 1), (0, 3)]) == [[1, 3], [0, 2]]


def test_fronts_of_nothing():
    assert non_dominated_fronts([]) == []


def test_crowding_distance_by_hand():
    # front 1: a(0,4) b(2,3) e(3,1) c(4,0); range 4 on x, 4 on y
    # x order a, b, e, c: a and c boundaries; b: (3 - 0) / 4 = 0.75; e: (4 - 2) / 4 = 0.5
    # y order c, e, b, a: c and a boundaries; e: (3 - 0) / 4 = 0.75; b: (4 - 1) / 4 = 0.75
    front = [POINTS[i] for i in (A, B, E, C)]
    assert crowding_distance(front) == [INF, 1.5, 1.25, INF]


def test_crowding_distance_is_normalised_by_each_objectives_range():
    # x spans 0..100, y spans 0..1: unnormalised, x would swamp y
    # x order p, q, r: q: (100 - 0) / 100 = 1; y order r, q, p: q: (1 - 0) / 1 = 1
    assert crowding_distance([(0, 1), (10, 0.9), (100, 0)]) == [INF, 2.0, INF]
    # p(0,1) q(50,.5) r(60,.4) s(100,0): the gap is between a point's two neighbours
    # q: x (60 - 0) / 100 = .6, y (1 - .4) / 1 = .6; r: x (100 - 50) / 100 = .5, y (.5 - 0) / 1 = .5
    points = [(0, 1.0), (50, 0.5), (60, 0.4), (100, 0.0)]
    assert crowding_distance(points) == pytest.approx([INF, 1.2, 1.0, INF])


def test_crowding_ties_boundaries_and_duplicates():
    # Identical points: the stable sort keeps their order, so on x the first of the tied lows
    # is the low boundary and the last of the tied highs the high one.
    # points u(0,2) v(0,2) w(2,0): x order u, v, w -> u, w inf; v: (2 - 0) / 2 = 1
    #                              y order w, u, v -> w, v inf; u: (2 - 0) / 2 = 1 (then inf)
    assert crowding_distance([(0, 2), (0, 2), (2, 0)]) == [INF, INF, INF]
    # four on a front, two identical in the middle
    points = [(0, 3), (1, 2), (1, 2), (3, 0)]
    # x order 0,1,2,3: 1: (1 - 0)/3, 2: (3 - 1)/3;  y order 3,1,2,0 (stable on the tie 2,2):
    # 1: (2 - 0)/3 (neighbours 3 and 2), 2: (3 - 2)/3 (neighbours 1 and 0)
    assert crowding_distance(points) == pytest.approx([INF, 1 / 3 + 2 / 3, 2 / 3 + 1 / 3, INF])


def test_an_objective_the_whole_front_shares_adds_nothing():
    # all equal on y: only x counts, and only x makes boundaries
    assert crowding_distance([(0, 5), (1, 5), (4, 5)]) == [INF, 1.0, INF]
    # all identical: nobody is a boundary, everyone is 0
    assert crowding_distance([(2, 2)] * 3) == [0.0, 0.0, 0.0]
    assert crowding_distance([]) == []


def test_crowding_order_breaks_ties_by_original_order():
    # distances [1, inf, 1, inf] -> the infinities first, each tie in the original order
    points = [(1, 3), (0, 4), (3, 1), (4, 0)]
    # x order 1,0,2,3: 0: (3 - 0)/4 = .75, 2: (4 - 1)/4 = .75; y the same by symmetry -> 1.5 each
    assert crowding_distance(points) == [1.5, INF, 1.5, INF]
    assert crowding_order(points) == [1, 3, 0, 2]


def test_pareto_select_fills_whole_fronts_then_cuts_by_crowding():
    assert pareto_select(POINTS, 7) == list(range(7))
    assert pareto_select(POINTS, 5) == [A, B, C, D, E]  # front 1 and front 2 fit exactly
    # 3 of front 1 (a b e c, distances inf 1.5 1.25 inf): a, c, then b
    assert pareto_select(POINTS, 3) == [A, B, C]
    assert pareto_select(POINTS, 2) == [A, C]
    assert pareto_select(POINTS, 0) == []
    with pytest.raises(ValueError):
        pareto_select(POINTS, -1)


def test_pareto_select_prefers_larger_variances():
    # a minimiser would take the origin
    assert pareto_select([(0, 0), (1, 1), (0.5, 0.5)], 1) == [1]


def test_pareto_select_with_equal_distances_takes_the_earlier_point():
    points = [(1, 3), (0, 4), (3, 1), (4, 0)]  # distances 1.5, inf, 1.5, inf
    assert pareto_select(points, 3) == [0, 1, 3]


def test_variance_is_the_population_variance():
    assert variance([1, 0, 0, 1]) == 0.25  # mean .5, squares .25 each, / 4
    assert variance([2, 4, 6]) == pytest.approx(8 / 3)  # (4 + 0 + 4) / 3
    assert variance([]) == 0.0


def test_mixed_result_filter():
    assert is_mixed([1, 0, 0])
    assert not is_mixed([1, 1, 1]) and not is_mixed([0, 0, 0])
    # successes are above the threshold (0.8: token F1 > 0.8)
    assert not is_mixed([0.8, 0.5])  # 0.8 is not above 0.8
    assert is_mixed([0.81, 0.5])
    assert not is_mixed([0.9, 1.0])  # graded but all successes
    assert is_mixed([0.9, 1.0], success_threshold=0.95)
    groups = [[1, 0], [1, 1], [0, 0], [0, 0.9, 0]]
    assert mixed_groups(groups) == [0, 3]


def group(gid, correctness, tools):
    return RolloutGroup(group_id=gid, correctness=correctness, tool_calls=tools)


def test_group_objectives():
    # tool calls [1, 3, 1, 3]: mean 2, variance 1; correctness [1, 0, 1, 1]: mean .75,
    # variance (3 * .0625 + .5625) / 4 = .1875
    assert group("q", [1, 0, 1, 1], [1, 3, 1, 3]).objectives == (1.0, 0.1875)


def test_select_groups_keeps_a_budget_of_mixed_groups_and_says_why():
    groups = [
        group("all-right", [1, 1, 1, 1], [0, 4, 0, 4]),  # (4, 0): front 1, but nothing to compare
        group("spread", [1, 0, 1, 0], [1, 3, 1, 3]),  # (1, .25): front 1
        group("quiet", [1, 0, 0, 0], [2, 2, 2, 2]),  # (0, .1875): beaten by spread
        group("middle", [1, 0, 1, 1], [1, 2, 2, 3]),  # (.5, .1875): beaten by spread
        group("same", [0, 0, 0, 0], [1, 1, 1, 1]),  # (0, 0): last
    ]
    selection = select_groups(groups, budget=3)
    assert selection.fronts == [["all-right", "spread"], ["middle"], ["quiet"], ["same"]]
    assert selection.kept == ["spread", "middle"]
    assert selection.dropped == ["all-right", "quiet", "same"]
    reasons = selection.reasons
    assert reasons["spread"].startswith("kept: front 1 of 4")
    assert "all 4 rollouts succeeded" in reasons["all-right"]
    assert reasons["quiet"].startswith("dropped: front 3 of 4")
    assert "budget of 3 was filled" in reasons["quiet"]
    assert set(reasons) == {g.group_id for g in groups}


def test_select_groups_says_when_crowding_cut_a_group():
    groups = [
        group("x-end", [1, 0, 1, 0], [0, 0, 0, 0]),  # (0, .25)
        group("mid", [1, 0, 0, 0], [1, 3, 1, 3]),  # (1, .1875)
        group("y-end", [1, 1, 0, 1], [0, 4, 0, 4]),  # (4, .1875): dominates mid
    ]
    # fronts are [x-end, y-end], [mid]; a budget of 1 cuts front 1: both boundaries (inf),
    # the earlier one wins
    selection = select_groups(groups, budget=1)
    assert selection.fronts == [["x-end", "y-end"], ["mid"]]
    assert selection.kept == ["x-end"]
    assert "kept on crowding distance inf" in selection.reasons["x-end"]
    assert "1 places left" in selection.reasons["y-end"]
    assert "crowding distance inf" in selection.reasons["y-end"]


def test_select_groups_refuses_bad_input():
    with pytest.raises(ValueError):
        select_groups([group("a", [1, 0], [1, 2]), group("a", [1, 0], [1, 2])], budget=1)
    with pytest.raises(ValueError):
        select_groups([group("a", [1, 0], [1, 2])], budget=-1)
    with pytest.raises(ValueError):
        group("a", [1, 0], [1])
    with pytest.raises(ValueError):
        group("a", [], [])
    with pytest.raises(ValueError):
        group("a", [1.5, 0], [1, 1])
