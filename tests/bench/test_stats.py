"""Distribution-free intervals over rounds: exact coverages, and the noise verdict."""

from __future__ import annotations

import itertools
import random

import pytest

from tandem.bench.stats import median_ci, shift_ci


@pytest.mark.parametrize(
    ("n", "low_rank", "coverage"),
    [
        (2, 1, 0.5),
        (3, 1, 0.75),
        (5, 1, 0.9375),
        (6, 1, 1 - 2 / 64),  # the fewest rounds that reach 95 %
        (9, 2, 1 - 2 * 10 / 512),
        (20, 6, None),
    ],
)
def test_the_median_interval_takes_the_order_statistics_that_reach_the_level(n, low_rank, coverage):
    values = [float(v) for v in range(1, n + 1)]
    ci = median_ci(list(reversed(values)))
    assert ci.n == n and ci.median == pytest.approx((n + 1) / 2)
    assert (ci.low, ci.high) == (low_rank, n + 1 - low_rank)
    assert ci.confidence is not None and ci.confidence >= min(0.95, coverage or 1)
    if coverage is not None:
        assert ci.confidence == pytest.approx(coverage)


def test_one_round_has_a_median_and_no_interval():
    assert median_ci([3.0]).model_dump() == {
        "n": 1,
        "median": 3.0,
        "low": None,
        "high": None,
        "confidence": None,
    }
    assert median_ci([]).median is None


def test_the_median_interval_covers_as_often_as_it_says():
    """Simulated: 6 rounds of a skewed figure; the true median is inside ~97 % of the time."""
    rng = random.Random(1)
    true_median = 1.0  # of exp(N(0, 0.3)), a log-normal latency
    trials = 4000
    inside = 0
    for _ in range(trials):
        ci = median_ci([rng.lognormvariate(0, 0.3) for _ in range(6)])
        assert ci.low is not None and ci.high is not None
        inside += ci.low <= true_median <= ci.high
    assert inside / trials == pytest.approx(1 - 2 / 64, abs=0.01)


def test_a_clear_shift_over_four_rounds_a_side_is_beyond_the_noise():
    a = [100.0, 101.0, 99.5, 100.5]
    b = [110.0, 111.0, 109.0, 112.0]
    shift = shift_ci(a, b)
    assert shift.verdict == "beyond-noise"
    # 4 against 4: only the extreme differences keep 95 % (P(U = 0) = 1/70)
    assert (shift.low, shift.high) == (min(y - x for x in a for y in b), 12.5)
    assert shift.confidence == pytest.approx(1 - 2 / 70)
    assert shift.estimate == pytest.approx(10.25)  # the median of the 16 differences
    assert shift_ci(b, a).verdict == "beyond-noise" and shift_ci(b, a).high < 0


def test_overlapping_rounds_are_within_the_noise():
    shift = shift_ci([100.0, 104.0, 98.0, 102.0, 101.0], [101.0, 99.0, 103.0, 100.5, 102.5])
    assert shift.verdict == "within-noise"
    assert shift.low is not None and shift.high is not None and shift.low < 0 < shift.high


@pytest.mark.parametrize(("m", "n"), [(1, 1), (3, 3), (3, 4), (2, 5)])
def test_too_few_rounds_never_call_a_difference(m, n):
    """However far apart: 3 against 3 rounds cannot show anything at 95 %."""
    shift = shift_ci([1.0] * m, [1000.0 + i for i in range(n)])
    assert shift.verdict == "too-few-rounds" and shift.low is None
    assert shift.estimate is not None and shift.estimate > 900


def test_the_shift_interval_agrees_with_a_permutation_count():
    """The confidence comes from the exact U distribution: check it by enumeration (5 vs 4)."""
    m, n, k = 5, 4, 2
    pool = list(range(m + n))
    at_most = sum(
        1
        for picked in itertools.combinations(pool, m)
        if sum(1 for x in picked for y in set(pool) - set(picked) if y < x) <= k - 1
    )
    total = sum(1 for _ in itertools.combinations(pool, m))
    shift = shift_ci([float(v) for v in range(5)], [float(v) + 0.5 for v in range(4)])
    assert total == 126 and shift.confidence == pytest.approx(1 - 2 * at_most / total)


def test_equal_rounds_are_within_the_noise_not_a_change():
    assert shift_ci([0.0] * 5, [0.0] * 5).verdict == "within-noise"
