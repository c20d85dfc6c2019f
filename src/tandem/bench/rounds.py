"""The headline figures of a load point, and of its rounds: each figure's median over the rounds
with a distribution-free confidence interval (``stats.median_ci``). Pure.

A run with ``--rounds N`` measures every point N times; the rounds of a point share its label.
One round's figure (its TTFT p50, say) is one value; the median over the rounds is what the
report shows, and the interval says how far the run-to-run noise could move it.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

from tandem.bench.load_generator import BenchResult, LoadPointResult
from tandem.bench.stats import MedianCI, median_ci

Unit = Literal["s", "tok/s", "req/s", "requests"]

HEADLINE: tuple[tuple[str, str, Unit, Literal["lower", "higher"]], ...] = (
    ("ttft_p50_s", "TTFT p50", "s", "lower"),
    ("ttft_p99_s", "TTFT p99", "s", "lower"),
    ("tpot_p50_s", "TPOT p50", "s", "lower"),
    ("tpot_p99_s", "TPOT p99", "s", "lower"),
    ("itl_p50_s", "ITL p50", "s", "lower"),
    ("e2el_p50_s", "E2EL p50", "s", "lower"),
    ("server_ttft_mean_s", "server's TTFT mean", "s", "lower"),
    ("output_throughput_tok_s", "output tok/s", "tok/s", "higher"),
    ("request_throughput_rps", "requests/s", "req/s", "higher"),
    ("failed", "failed", "requests", "lower"),
)
"""Key, name, unit (a key's suffix does not say it: ``_tok_s`` is a rate), and which is better."""


_PERCENTILE = re.compile(r"(\w+)_(p\d+)_s")


def headline(point: LoadPointResult, key: str) -> float | None:
    """One ``HEADLINE`` figure of a point, read by its key: ``<x>_pNN_s`` is percentile NN of the
    metrics' ``<x>_s``, ``server_<f>`` the server's own ``<f>``, else a field of the metrics."""
    if key.startswith("server_"):
        return getattr(point.server, key.removeprefix("server_")) if point.server else None
    if percentile := _PERCENTILE.fullmatch(key):
        return getattr(getattr(point.metrics, percentile[1] + "_s"), percentile[2])
    value = getattr(point.metrics, key)
    return None if value is None else float(value)


def values_over_rounds(rounds: list[LoadPointResult], key: str) -> list[float]:
    """One ``HEADLINE`` figure of each round that has it."""
    return [v for v in (headline(p, key) for p in rounds) if v is not None]


class FigureRounds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    name: str
    unit: Unit
    values: list[float]
    median: MedianCI


class PointRounds(BaseModel):
    """Every headline figure of one load point over its rounds."""

    model_config = ConfigDict(extra="forbid")

    label: str
    rounds: int
    figures: list[FigureRounds]

    def figure(self, key: str) -> FigureRounds:
        return next(f for f in self.figures if f.key == key)


def rounds_summary(result: BenchResult, confidence: float = 0.95) -> list[PointRounds]:
    """Per load point, each headline figure's median over its rounds and its interval."""
    summary = []
    for label in result.labels():
        rounds = result.rounds_of(label)
        figures = []
        for key, name, unit, _ in HEADLINE:
            values = values_over_rounds(rounds, key)
            figures.append(
                FigureRounds(
                    key=key,
                    name=name,
                    unit=unit,
                    values=values,
                    median=median_ci(values, confidence),
                )
            )
        summary.append(PointRounds(label=label, rounds=len(rounds), figures=figures))
    return summary
