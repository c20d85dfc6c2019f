"""Two benchmark summaries side by side: the differences of matching load points. Pure.

Load points match by label (``c1``, ``r2``, ``long``). For each headline figure the comparison
holds A's value, B's value, B − A and the relative change (B − A) / A; a lower latency or a
higher throughput is better, and ``better`` says which side won. With several rounds on a side
(``--rounds``) its value is the median over its rounds.

Whether a difference is beyond the noise is decided over the rounds (``stats.shift_ci``): the
exact distribution-free interval of the shift B − A at ``confidence`` (Hodges–Lehmann /
Mann–Whitney) leaves out 0, or it does not, or the rounds are too few to tell (fewer than 4
on each side at 95 %). ``Comparison.verdict()`` is the answer an upgrade gate asks for: the
figures B made worse beyond the noise, those it made better, and those it cannot tell.

Two runs measured with different workload settings (``COMPARED_SETTINGS``: prompt and output
lengths, sampling, request counts...) compare unlike with unlike: the comparison lists each
such setting with both values in ``settings_differ``, and every view of it says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.bench.load_generator import SUMMARY_FILE, BenchResult
from tandem.bench.rounds import HEADLINE, Unit, rounds_summary
from tandem.bench.stats import SAME, ShiftCI, shift_ci
from tandem.jsonfiles import read_json

COMPARED_SETTINGS: tuple[str, ...] = (
    "endpoint",
    "input_tokens",
    "output_tokens",
    "ignore_eos",
    "temperature",
    "prompt_token_ids",
    "prompt_file",
    "prompt_column",
    "prefix_tokens",
    "prefix_groups",
    "turns",
    "extra_body",
    "requests",
    "burstiness",
    "max_concurrency",
    "long_context_requests",
    "warmup_requests",
    "seed",
    "scrape_metrics",
    "kv_sample_interval_s",
)
"""``BenchConfig`` fields that change what a load point measures. Not compared: the URL and the
model (what an A/B is usually about), the ladders (points match by label), the rounds (more
only narrow the noise), the SLOs and the roofline (goodput and the roofline fraction are not
compared), timeouts and the idle check."""


class SettingDiff(BaseModel):
    """A workload setting in which the two runs differ."""

    model_config = ConfigDict(extra="forbid")

    name: str
    a: Any
    b: Any


class FigureDiff(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    name: str
    unit: Unit
    a: float | None
    b: float | None
    diff: float | None
    relative: float | None
    better: Literal["a", "b", "same"] | None
    noise: ShiftCI | None = Field(
        default=None, description="B − A over the rounds, and whether it is beyond the noise."
    )

    @property
    def beyond_noise(self) -> bool:
        return self.noise is not None and self.noise.verdict == "beyond-noise"


class PointDiff(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    figures: list[FigureDiff]


class FigureRef(BaseModel):
    """One figure of one load point, as a verdict lists it."""

    model_config = ConfigDict(extra="forbid")

    label: str
    figure: FigureDiff


class Verdict(BaseModel):
    """B against A, beyond the noise of their rounds: what an upgrade gate acts on.

    Usage:
        verdict = compare(load_summary("runs/base"), load_summary("runs/new")).verdict()
        if not verdict.passed:
            for ref in verdict.worse: print(ref.label, ref.figure.name, ref.figure.relative)
    """

    model_config = ConfigDict(extra="forbid")

    confidence: float
    worse: list[FigureRef] = Field(description="B worse than A beyond the noise.")
    better: list[FigureRef] = Field(description="B better than A beyond the noise.")
    undecided: list[FigureRef] = Field(
        description="Too few rounds on a side to tell noise from a change."
    )

    @property
    def passed(self) -> bool:
        """No figure got worse beyond the noise (figures too few rounds can judge do not fail
        it: a gate that needs them judged asks for ``undecided`` to be empty too)."""
        return not self.worse


class Comparison(BaseModel):
    """A versus B, per matching load point; labels found on one side only are listed."""

    model_config = ConfigDict(extra="forbid")

    a: str
    b: str
    points: list[PointDiff]
    only_in_a: list[str]
    only_in_b: list[str]
    settings_differ: list[SettingDiff] = Field(
        default_factory=list, description="Workload settings that differ: unlike compared."
    )
    confidence: float = Field(default=0.95, description="Level of the noise intervals, 0..1.")

    def verdict(self) -> Verdict:
        """The figures B changed beyond the noise, each way, and those it cannot tell."""
        refs: dict[str, list[FigureRef]] = {"worse": [], "better": [], "undecided": []}
        for point in self.points:
            for f in point.figures:
                if f.noise is None or f.better is None:
                    continue
                if f.noise.verdict == "too-few-rounds":
                    refs["undecided"].append(FigureRef(label=point.label, figure=f))
                elif f.beyond_noise and f.better != "same":
                    side = "better" if f.better == "b" else "worse"
                    refs[side].append(FigureRef(label=point.label, figure=f))
        return Verdict(confidence=self.confidence, **refs)


def compare(
    a: BenchResult,
    b: BenchResult,
    a_name: str = "A",
    b_name: str = "B",
    *,
    confidence: float = 0.95,
) -> Comparison:
    """Differences of B against A for every load point both have: ``rounds_summary``'s medians
    over the rounds, and the shift of their values."""
    summary_a, summary_b = rounds_summary(a), {p.label: p for p in rounds_summary(b)}
    points = []
    for point in (p for p in summary_a if p.label in summary_b):
        figures = []
        for (*_, good), fa, fb in zip(HEADLINE, point.figures, summary_b[point.label].figures):
            va, vb = fa.median.median, fb.median.median
            diff = vb - va if va is not None and vb is not None else None
            better: Literal["a", "b", "same"] | None = None
            if diff is not None:
                same = abs(diff) <= SAME * max(abs(va or 0), abs(vb or 0))
                better = "same" if same else ("b" if (diff < 0) == (good == "lower") else "a")
            figures.append(
                FigureDiff(
                    **fa.model_dump(include={"key", "name", "unit"}),
                    a=va,
                    b=vb,
                    diff=diff,
                    relative=diff / va if diff is not None and va else None,
                    better=better,
                    noise=shift_ci(fa.values, fb.values, confidence)
                    if fa.values and fb.values
                    else None,
                )
            )
        points.append(PointDiff(label=point.label, figures=figures))
    labels_a = {p.label for p in summary_a}
    return Comparison(
        a=a_name,
        b=b_name,
        points=points,
        only_in_a=sorted(labels_a - set(summary_b)),
        only_in_b=sorted(set(summary_b) - labels_a),
        settings_differ=differing_settings(a, b),
        confidence=confidence,
    )


def differing_settings(a: BenchResult, b: BenchResult) -> list[SettingDiff]:
    """The ``COMPARED_SETTINGS`` whose values differ between the two runs."""
    va, vb = a.config.model_dump(mode="json"), b.config.model_dump(mode="json")
    return [
        SettingDiff(name=name, a=va.get(name), b=vb.get(name))
        for name in COMPARED_SETTINGS
        if va.get(name) != vb.get(name)
    ]


def load_summary(path: str | Path) -> BenchResult:
    """A ``summary.json``, given its path or the run folder holding it.

    Raises:
        SpecError: missing, unreadable, or not a tandem bench summary.
    """
    p = Path(path)
    return read_json(
        p / SUMMARY_FILE if p.is_dir() else p,
        BenchResult,
        what="tandem bench summary",
        hint="pass a run folder written by `tandem bench --out DIR` or its summary.json",
    )
