"""Two benchmark summaries side by side: the differences of matching load points. Pure.

Load points match by label (``c1``, ``r2``, ``long``). For each headline figure the comparison
holds A's value, B's value, B − A and the relative change (B − A) / A; a lower latency or a
higher throughput is better, and ``better`` says which side won.

Two runs measured with different workload settings (``COMPARED_SETTINGS``: prompt and output
lengths, sampling, request counts...) compare unlike with unlike: the comparison lists each
such setting with both values in ``settings_differ``, and every view of it says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.bench.load_generator import SUMMARY_FILE, BenchResult, LoadPointResult
from tandem.jsonfiles import read_json

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


def headline(point: LoadPointResult) -> dict[str, float | None]:
    """The figures compared, by key of ``HEADLINE``."""
    m = point.metrics
    return {
        "ttft_p50_s": m.ttft_s.p50,
        "ttft_p99_s": m.ttft_s.p99,
        "tpot_p50_s": m.tpot_s.p50,
        "tpot_p99_s": m.tpot_s.p99,
        "itl_p50_s": m.itl_s.p50,
        "e2el_p50_s": m.e2el_s.p50,
        "server_ttft_mean_s": point.server.ttft_mean_s if point.server else None,
        "output_throughput_tok_s": m.output_throughput_tok_s,
        "request_throughput_rps": m.request_throughput_rps,
        "failed": float(m.failed),
    }


COMPARED_SETTINGS: tuple[str, ...] = (
    "endpoint",
    "input_tokens",
    "output_tokens",
    "ignore_eos",
    "temperature",
    "prompt_token_ids",
    "prompt_file",
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
model (what an A/B is usually about), the ladders (points match by label), the SLOs and the
roofline (goodput and the roofline fraction are not compared), timeouts and the idle check."""


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


class PointDiff(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    figures: list[FigureDiff]


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


def compare(a: BenchResult, b: BenchResult, a_name: str = "A", b_name: str = "B") -> Comparison:
    """Differences of B against A for every load point both have."""
    labels_b = {p.point.label for p in b.points}
    labels_a = {p.point.label for p in a.points}
    points = []
    for pa in a.points:
        pb = b.point(pa.point.label)
        if pb is None:
            continue
        ha, hb = headline(pa), headline(pb)
        figures = []
        for key, name, unit, good in HEADLINE:
            va, vb = ha[key], hb[key]
            diff = vb - va if va is not None and vb is not None else None
            rel = diff / va if diff is not None and va else None
            better: Literal["a", "b", "same"] | None = None
            if diff is not None:
                better = "same" if diff == 0 else ("b" if (diff < 0) == (good == "lower") else "a")
            figures.append(
                FigureDiff(
                    key=key,
                    name=name,
                    unit=unit,
                    a=va,
                    b=vb,
                    diff=diff,
                    relative=rel,
                    better=better,
                )
            )
        points.append(PointDiff(label=pa.point.label, figures=figures))
    return Comparison(
        a=a_name,
        b=b_name,
        points=points,
        only_in_a=sorted(labels_a - labels_b),
        only_in_b=sorted(labels_b - labels_a),
        settings_differ=differing_settings(a, b),
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
