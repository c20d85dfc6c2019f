"""The gate's speed verdict: pass, fail or cannot tell, by ``bench compare``'s noise rule against
the upgrade's limits, with the first round of each side a warm-up."""

from __future__ import annotations

import pytest

from tandem.bench.load_generator import BenchResult
from tandem.bench.metrics import load_point_metrics
from tandem.bench.speed_gate import SpeedLimits, counted_medians, speed_verdict

from .test_compare_report_cli import result
from .test_metrics import rec


def rounds(gaps: list[float], *, failed: int = 0) -> BenchResult:
    """A run of one point, a round per TPOT given (the first round: the warm-up)."""
    runs = [result(0.1, gap) for gap in gaps]
    base = runs[0]
    base.config = base.config.model_copy(update={"rounds": len(gaps)})
    base.points = [
        p.model_copy(update={"point": p.point.model_copy(update={"round": r})})
        for r, run in enumerate(runs, 1)
        for p in run.points
    ]
    if failed:
        last = base.points[-1]
        records = [rec(i, gaps=(gaps[-1],) * 3) for i in range(3)] + [rec(9, ok=False)]
        base.points[-1] = last.model_copy(update={"metrics": load_point_metrics(records)})
    return base


BASE = [0.200, 0.050, 0.051, 0.049, 0.050, 0.052]  # a slow warm-up round, then 50 ms


def test_the_same_speed_passes_and_the_warm_up_round_is_not_counted():
    verdict = speed_verdict([rounds(BASE)], [rounds([0.300, 0.051, 0.050, 0.049, 0.052, 0.050])])
    assert verdict.outcome == "pass", verdict.summary
    assert (verdict.rounds_baseline, verdict.rounds_new) == (5, 5)
    tpot = verdict.figures[0]
    assert tpot.baseline == pytest.approx(0.050) and tpot.new == pytest.approx(0.050)
    assert "median TPOT" in verdict.summary and "limit +25%" in verdict.summary


def test_a_revisions_recorded_medians_leave_its_warm_up_out():
    medians = counted_medians([rounds([0.200, 0.050, 0.054, 0.049, 0.050, 0.052])], SpeedLimits())
    assert medians["tpot_p50_s"] == pytest.approx(0.050)
    assert set(medians) == {"tpot_p50_s", "output_throughput_tok_s"}
    everything = counted_medians([rounds([0.200, 0.200, 0.054])], SpeedLimits(warmup_rounds=0))
    assert everything["tpot_p50_s"] == pytest.approx(0.200)


def test_much_slower_beyond_the_noise_fails():
    verdict = speed_verdict([rounds(BASE)], [rounds([0.2, 0.080, 0.082, 0.079, 0.081, 0.080])])
    assert verdict.outcome == "fail" and "slower than the limit" in verdict.summary
    assert verdict.figures[0].outcome == "fail"  # TPOT (these runs' throughput is paced)


def test_slower_within_the_limit_passes():
    verdict = speed_verdict([rounds(BASE)], [rounds([0.2, 0.055, 0.056, 0.054, 0.055, 0.056])])
    assert verdict.outcome == "pass", verdict.summary


def test_noise_wider_than_the_limit_cannot_tell_and_asks_for_rounds():
    noisy = [0.2, 0.040, 0.090, 0.045, 0.085, 0.050]
    verdict = speed_verdict([rounds(BASE)], [rounds(noisy)])
    assert verdict.outcome == "cannot-tell"
    assert "measure more rounds of both" in verdict.summary


def test_too_few_rounds_cannot_tell():
    verdict = speed_verdict([rounds([0.2, 0.05, 0.05])], [rounds([0.2, 0.09, 0.09])])
    assert verdict.outcome == "cannot-tell" and verdict.figures[0].shift.verdict == (
        "too-few-rounds"
    )


def test_runs_of_a_side_are_pooled():
    halves = [rounds([0.2, 0.050, 0.051, 0.049]), rounds([0.2, 0.050, 0.052, 0.050])]
    verdict = speed_verdict(halves, [rounds([0.2, 0.08, 0.081, 0.079, 0.08, 0.082, 0.08])])
    assert verdict.rounds_baseline == 6 and verdict.outcome == "fail"


def test_a_failed_request_fails_whatever_the_speed():
    verdict = speed_verdict([rounds(BASE)], [rounds(BASE, failed=1)])
    assert verdict.outcome == "fail" and verdict.failed_requests == 1


def test_looser_limits_let_the_slower_pass():
    slower = rounds([0.2, 0.080, 0.082, 0.079, 0.081, 0.080])
    limits = SpeedLimits(max_tpot_increase=1.0, max_throughput_drop=0.6)
    assert speed_verdict([rounds(BASE)], [slower], limits).outcome == "pass"
