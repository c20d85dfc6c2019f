"""Accuracy with a 95% interval that respects repeats of the same question.

With ``k`` repeats of ``n`` questions the samples are not independent: a question the model
cannot answer is wrong every time. The estimate and interval are therefore computed over
question means ``q_i`` (the fraction of question *i*'s repeats that were right):

    accuracy = mean(q_i)                       (pass@1; equals the sample mean when k is equal)
    se       = stdev(q_i) / sqrt(n)            (sample stdev, n-1; clustered by question)
    ci95     = accuracy ± 1.96 · se, clipped to [0, 1]                method "cluster-normal"

When every ``q_i`` is equal (all right, all wrong, or a single question) that standard error is 0
and says nothing; the interval is then Wilson's score interval for ``n`` questions at that
accuracy (method "wilson"), e.g. 0 of 5 → [0, 0.434].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel

Z95 = 1.959963984540054


class Accuracy(BaseModel):
    """An accuracy, its 95% interval and what it was computed from."""

    accuracy: float | None
    ci95_low: float | None
    ci95_high: float | None
    se: float | None
    n_questions: int
    n_samples: int
    method: str


def wilson_interval(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``p`` observed over ``n`` trials."""
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the bounds always contain p (floating point can put them a hair past it at 0 and 1)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def clustered_accuracy(scores: Mapping[str, Sequence[float]]) -> Accuracy:
    """Accuracy and 95% interval from per-question lists of 0/1 scores (one per repeat).

    Usage:
        clustered_accuracy({"q1": [1, 1], "q2": [0, 1], "q3": [0, 0]})
    """
    means = [sum(s) / len(s) for s in scores.values() if len(s)]
    n = len(means)
    n_samples = sum(len(s) for s in scores.values())
    if n == 0:
        return Accuracy(
            accuracy=None,
            ci95_low=None,
            ci95_high=None,
            se=None,
            n_questions=0,
            n_samples=0,
            method="none",
        )
    acc = sum(means) / n
    if n > 1 and max(means) != min(means):
        sd = math.sqrt(sum((m - acc) ** 2 for m in means) / (n - 1))
        se = sd / math.sqrt(n)
        low, high, method = max(0.0, acc - Z95 * se), min(1.0, acc + Z95 * se), "cluster-normal"
    else:
        se, method = 0.0, "wilson"
        low, high = wilson_interval(acc, n)
    return Accuracy(
        accuracy=acc,
        ci95_low=low,
        ci95_high=high,
        se=se,
        n_questions=n,
        n_samples=n_samples,
        method=method,
    )


def group_scores(rows: Iterable[tuple[str, float]]) -> dict[str, list[float]]:
    """``(question id, score)`` pairs → per-question score lists, in first-seen order."""
    grouped: dict[str, list[float]] = {}
    for question, score in rows:
        grouped.setdefault(question, []).append(score)
    return grouped
