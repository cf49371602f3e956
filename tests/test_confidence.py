import pytest

from flywheel.confidence import wilson_interval


def test_wilson_interval_against_hand_computed_values():
    # 4 of 26: p = 0.15385, z^2/n = 0.14775; centre 0.19841, half-width 0.13691.
    low, high = wilson_interval(4, 26)
    assert low == pytest.approx(0.0615, abs=5e-4) and high == pytest.approx(0.3353, abs=5e-4)
    # 0 of 12: [0, z^2/(n + z^2)] = [0, 3.8415 / 15.8415].
    assert wilson_interval(0, 12) == (0.0, pytest.approx(0.2425, abs=5e-4))
    # 10 of 10 mirrors 0 of 10.
    assert wilson_interval(10, 10) == (pytest.approx(1 - wilson_interval(0, 10)[1]), 1.0)
    # 13 of 26: centre 0.5, half-width 1.96 * sqrt(0.25/26 + 0.14775/104) / 1.14775 = 0.1794.
    assert wilson_interval(13, 26) == (
        pytest.approx(0.3206, abs=2e-4),
        pytest.approx(0.6794, abs=2e-4),
    )


def test_no_trials_say_nothing_and_impossible_counts_are_refused():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="5 successes in 4 trials"):
        wilson_interval(5, 4)
