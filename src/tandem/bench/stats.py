"""Confidence intervals that assume no distribution: the median of a few rounds, and the shift
between two sets of rounds. Pure.

A benchmark repeated N rounds gives N values of each figure (TTFT p50 of round 1, 2, ...).
Run-to-run noise (clocks, caches, what else the host runs) shows in the spread of those values,
not in the requests of one round, whose latencies move together. So these statistics take one
value per round and assume nothing of the values' distribution:

- ``median_ci``: the order-statistic interval. [x_(k), x_(n+1-k)] of the sorted values holds the
  true median with probability 1 − 2·P(Binomial(n, ½) ≤ k − 1); k is the largest that reaches
  the confidence asked. Below 6 rounds no k reaches 95 %: the interval is then [min, max] and
  carries its own, lower confidence (5 rounds: 93.75 %; 3: 75 %). One round has no interval.
- ``shift_ci``: B − A as the Hodges–Lehmann estimate (the median of all m·n differences
  b_j − a_i) with its exact distribution-free interval [d_(k), d_(mn+1-k)], k from the
  Mann–Whitney U distribution. The interval leaves out 0 exactly when the two-sided
  Mann–Whitney test says "no shift" is unlikely at that level: the difference is beyond the
  noise. When C(m+n, m) < 2 / (1 − confidence) no interval can reach the level (3 rounds
  against 3 at 95 %: 4 against 4 is the least), and the verdict says "too few rounds".
  The U distribution used is the one without ties; tied values (two rounds with 0 failures)
  only widen the interval toward 0, never make a shift out of nothing. A shift within
  ``SAME`` of the values' size is 0: figures computed two ways (a sum of gaps, a difference of
  times) differ in their last bits, and no gate should fail on that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["beyond-noise", "within-noise", "too-few-rounds"]
SAME = 1e-9
"""Relative difference below which two values are the same (float rounding, not a change)."""


class MedianCI(BaseModel):
    """The median of some rounds' values and a distribution-free interval around it."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(description="Values (rounds) it is made of.")
    median: float | None = None
    low: float | None = None
    high: float | None = None
    confidence: float | None = Field(
        default=None,
        description="Coverage the interval reaches, 0..1: the level asked, or less when the "
        "rounds are too few for it; None for fewer than 2 values.",
    )


class ShiftCI(BaseModel):
    """B − A over rounds: estimate, interval and whether it is beyond the noise."""

    model_config = ConfigDict(extra="forbid")

    rounds_a: int
    rounds_b: int
    estimate: float | None = Field(default=None, description="Hodges–Lehmann shift B − A.")
    low: float | None = None
    high: float | None = None
    confidence: float | None = Field(
        default=None, description="Coverage the interval reaches; None: too few rounds."
    )
    verdict: Verdict


def median_ci(values: Sequence[float], confidence: float = 0.95) -> MedianCI:
    """The median of ``values`` with its order-statistic interval.

    Usage:
        median_ci([10.0, 11.0, 12.0, 13.0, 30.0])   # median 12, [10, 30] at 93.75 %
    """
    data = sorted(values)
    n = len(data)
    if n == 0:
        return MedianCI(n=0)
    median = _median(data)
    if n < 2:
        return MedianCI(n=n, median=median)
    alpha = 1 - confidence
    k = 1
    while k + 1 <= n // 2 and _binom_cdf(n, k) <= alpha / 2:  # P(Bin <= (k+1) - 1)
        k += 1
    return MedianCI(
        n=n,
        median=median,
        low=data[k - 1],
        high=data[n - k],
        confidence=1 - 2 * _binom_cdf(n, k - 1),
    )


def shift_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> ShiftCI:
    """How far B lies from A, and whether that is beyond the rounds' noise.

    Usage:
        shift_ci([10, 11, 10.5, 10.2], [12, 12.5, 11.9, 12.2]).verdict   # "beyond-noise"
    """
    m, n = len(a), len(b)
    diffs = sorted(y - x for x in a for y in b)
    estimate = _median(diffs) if diffs else None
    k = _shift_k(m, n, 1 - confidence) if m and n else 0
    if k == 0:
        return ShiftCI(rounds_a=m, rounds_b=n, estimate=estimate, verdict="too-few-rounds")
    low, high = diffs[k - 1], diffs[m * n - k]
    tolerance = SAME * max(abs(v) for v in (*a, *b))
    beyond = low > tolerance or high < -tolerance
    return ShiftCI(
        rounds_a=m,
        rounds_b=n,
        estimate=estimate,
        low=low,
        high=high,
        confidence=1 - 2 * _u_cdf(m, n, k - 1),
        verdict="beyond-noise" if beyond else "within-noise",
    )


def _median(data: Sequence[float]) -> float:
    n = len(data)
    mid = n // 2
    return data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2


def _binom_cdf(n: int, k: int) -> float:
    """P(Binomial(n, ½) ≤ k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n if k >= 0 else 0.0


def _shift_k(m: int, n: int, alpha: float) -> int:
    """The largest k with P(U ≤ k − 1) ≤ α/2 (0: none, the rounds are too few)."""
    k = 0
    while k < m * n // 2 + 1 and _u_cdf(m, n, k) <= alpha / 2:
        k += 1
    return k


def _u_cdf(m: int, n: int, u: int) -> float:
    """P(U ≤ u) for the Mann–Whitney U of samples of m and n, without ties."""
    if u < 0:
        return 0.0
    counts = _u_counts(m, n)
    return sum(counts[: u + 1]) / math.comb(m + n, m)


@cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings give U = 0, 1, ..., mn (the coefficients of the
    Gaussian binomial [m+n choose m]): U(m, n) is U(m−1, n) + n (the largest value is an
    A) or U(m, n−1) (it is a B)."""
    if m == 0 or n == 0:
        return (1,)
    counts = [0] * (m * n + 1)
    for u, c in enumerate(_u_counts(m - 1, n)):
        counts[u + n] += c
    for u, c in enumerate(_u_counts(m, n - 1)):
        counts[u] += c
    return tuple(counts)
