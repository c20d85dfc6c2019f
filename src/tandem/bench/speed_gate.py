"""The speed verdict of an upgrade's gate: is the new revision slower than its limit, beyond the
noise? Pure.

An upgrade measures the revision it leaves (the baseline) and the one it starts, the same way:
the same workload, a warm-up round at the bench's own concurrency that is not counted, then
several rounds. Each figure is judged as ``bench compare`` judges a difference
(``stats.shift_ci``: the exact distribution-free interval of the shift new − baseline over the
rounds), against the limit the user set, as a fraction of the baseline's median:

- **pass**: even the worse end of the interval is within the limit (the new revision is not
  slower than allowed, at ``confidence``);
- **fail**: even the better end is beyond it (it is slower than allowed, at ``confidence``),
  or a request failed;
- **cannot tell**: the interval straddles the limit, or the rounds are too few for any
  interval (fewer than 4 a side at 95 %): the noise is wider than the limit, and the verdict
  asks for more rounds rather than guess.

The figures: median TPOT (``max_tpot_increase``, may grow by that fraction) and output tok/s
(``max_throughput_drop``, may fall by that fraction), the flags of ``tandem upgrade``.

Usage:
    verdict = speed_verdict([load_summary("runs/old")], [load_summary("runs/new")], SpeedLimits())
    if verdict.outcome == "cannot-tell": ...   # measure more rounds of both
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.bench.load_generator import BenchResult, LoadPointResult
from tandem.bench.rounds import values_over_rounds
from tandem.bench.stats import ShiftCI, median_ci, shift_ci

SpeedOutcome = Literal["pass", "fail", "cannot-tell"]
WARMUP_ROUNDS = 1
"""Rounds of each point discarded as warm-up by default: the first measurement of a fresh
revision runs its batch shapes for the first time."""


class SpeedLimits(BaseModel):
    """How much slower the new revision may be (the flags of ``tandem upgrade``)."""

    model_config = ConfigDict(extra="forbid")

    max_tpot_increase: float = Field(
        default=0.25, ge=0, description="Median TPOT may grow by this fraction (0.25 = 25 %)."
    )
    max_throughput_drop: float = Field(
        default=0.25, ge=0, le=1, description="Output tok/s may fall by this fraction."
    )
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Level of the intervals.")
    warmup_rounds: int = Field(
        default=WARMUP_ROUNDS,
        ge=0,
        description="First rounds of each side not counted (the batch shapes' warm-up).",
    )


class SpeedFigure(BaseModel):
    """One figure, baseline against new, with its interval and its limit."""

    model_config = ConfigDict(extra="forbid")

    key: str
    name: str
    baseline: float | None = Field(description="Median over the baseline's counted rounds.")
    new: float | None = Field(description="Median over the new revision's counted rounds.")
    limit: float | None = Field(
        description="The largest change allowed, in the figure's unit (signed: worse way)."
    )
    shift: ShiftCI
    outcome: SpeedOutcome

    def text(self) -> str:
        if self.baseline is None or self.new is None or self.limit is None:
            return f"{self.name}: no value"
        low, high = self.shift.low, self.shift.high
        scale = self.baseline or 1.0
        interval = (
            f"[{low / scale:+.0%}, {high / scale:+.0%}]"
            if low is not None and high is not None
            else "no interval"
        )
        return (
            f"{self.name} {self.new:.4g} vs {self.baseline:.4g} "
            f"({(self.new - self.baseline) / scale:+.0%}, interval {interval}, "
            f"limit {self.limit / scale:+.0%})"
        )


class SpeedVerdict(BaseModel):
    """The verdict, with the figures it stands on."""

    model_config = ConfigDict(extra="forbid")

    outcome: SpeedOutcome
    summary: str
    figures: list[SpeedFigure]
    rounds_baseline: int
    rounds_new: int
    failed_requests: int = 0


FIGURES: tuple[tuple[str, str, Literal["lower", "higher"]], ...] = (
    ("tpot_p50_s", "median TPOT", "lower"),
    ("output_throughput_tok_s", "output tok/s", "higher"),
)


def _rounds(results: list[BenchResult], label: str | None, skip: int) -> list[LoadPointResult]:
    """The counted rounds of one load point over several runs (each run's first ``skip`` of
    that point are its warm-up)."""
    found = []
    for result in results:
        point = label or (result.labels()[0] if result.labels() else None)
        found += result.rounds_of(point)[skip:] if point else []
    return found


def _figure(
    key: str,
    name: str,
    good: Literal["lower", "higher"],
    rounds_a: list[LoadPointResult],
    rounds_b: list[LoadPointResult],
    limits: SpeedLimits,
) -> SpeedFigure:
    """One figure, judged over the counted rounds of both sides."""
    baseline, new = values_over_rounds(rounds_a, key), values_over_rounds(rounds_b, key)
    shift = shift_ci(baseline, new, limits.confidence)
    base, after = median_ci(baseline).median, median_ci(new).median
    fraction = limits.max_tpot_increase if good == "lower" else -limits.max_throughput_drop
    limit = base * fraction if base is not None else None
    outcome: SpeedOutcome = "cannot-tell"
    if limit is not None and shift.low is not None and shift.high is not None:
        # the worse way: up for a latency, down for a throughput
        worst, best = (shift.high, shift.low) if good == "lower" else (shift.low, shift.high)
        beyond = (lambda x: x > limit) if good == "lower" else (lambda x: x < limit)
        if not beyond(worst):
            outcome = "pass"
        elif beyond(best):
            outcome = "fail"
    return SpeedFigure(
        key=key, name=name, baseline=base, new=after, limit=limit, shift=shift, outcome=outcome
    )


def counted_medians(results: list[BenchResult], limits: SpeedLimits) -> dict[str, float]:
    """The judged figures' medians over the counted rounds of ``results`` (what a revision's
    record keeps of its measurement, as ``speed_verdict`` reads it)."""
    rounds = _rounds(results, None, limits.warmup_rounds)
    found = {key: median_ci(values_over_rounds(rounds, key)).median for key, _, _ in FIGURES}
    return {key: value for key, value in found.items() if value is not None}


def speed_verdict(
    baseline: list[BenchResult],
    new: list[BenchResult],
    limits: SpeedLimits | None = None,
    *,
    label: str | None = None,
) -> SpeedVerdict:
    """The new revision's speed against the baseline's, judged beyond the rounds' noise.

    Args:
        baseline: the runs of the revision left (their rounds pooled), measured as ``new``.
        new: the runs of the revision started.
        label: the load point judged (default: each run's first).
    """
    limits = limits or SpeedLimits()
    rounds_a = _rounds(baseline, label, limits.warmup_rounds)
    rounds_b = _rounds(new, label, limits.warmup_rounds)
    failed = int(sum(values_over_rounds(rounds_b, "failed")))
    figures = [_figure(*figure, rounds_a, rounds_b, limits) for figure in FIGURES]
    outcomes = {f.outcome for f in figures}
    details = "; ".join(f.text() for f in figures)
    if failed:
        outcome: SpeedOutcome = "fail"
        summary = f"{failed} request(s) of the new revision failed; {details}"
    elif "fail" in outcomes:
        outcome = "fail"
        summary = "slower than the limit beyond the noise: " + details
    elif "cannot-tell" in outcomes:
        outcome = "cannot-tell"
        summary = (
            f"cannot tell: the noise of {len(rounds_a)} and {len(rounds_b)} rounds is wider "
            f"than the limit; measure more rounds of both ({details})"
        )
    else:
        outcome = "pass"
        summary = "within the limits beyond the noise: " + details
    return SpeedVerdict(
        outcome=outcome,
        summary=summary,
        figures=figures,
        rounds_baseline=len(rounds_a),
        rounds_new=len(rounds_b),
        failed_requests=failed,
    )
