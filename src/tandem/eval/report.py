"""The eval report: a versioned JSON model computed from the response log alone, and its
Markdown and per-question HTML views (made from the model, never from the run).

Timing fields (``wall_time_s``, ``tokens_per_s``, latencies, ``created_at``) live in ``timing``
and in each question's ``latency_s``; everything else is a pure function of the logged texts,
so an interrupted-and-resumed run reports the same as an uninterrupted one.
"""

from __future__ import annotations

import html
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tandem import files
from tandem.eval.log import LogContents, SampleRecord
from tandem.eval.score import ScoredSample, accuracy_of, score_sample
from tandem.eval.stats import Accuracy
from tandem.redact import Redactor

SCHEMA_VERSION = 1
PUBLISHED_REFERENCE = 0.881
"""DeepSeek-V4-Flash's published GPQA-Diamond pass@1 (model card), the seed's comparison point."""


class GroupResult(BaseModel):
    """Accuracy of one domain or subdomain."""

    name: str
    accuracy: Accuracy


class Rates(BaseModel):
    """Fractions of samples (not questions)."""

    truncated: float = Field(description="Main response hit max_tokens (finish_reason length).")
    reasked: float = Field(description="Asked again (the thinking-off re-ask): no answer found.")
    fallback: float = Field(description="Answer taken from the re-ask (a share of all samples).")
    unparsed: float = Field(description="No answer found, re-ask included; scored wrong.")
    errors: float = Field(description="The server refused the request (4xx).")
    rules: dict[str, int] = Field(description="Samples per extraction rule that fired.")


class QuestionResult(BaseModel):
    record_id: str
    domain: str
    subdomain: str
    n_samples: int
    n_correct: int
    answers: list[str | None]
    correct_letters: list[str]
    rules: list[str]
    truncated: int
    mean_completion_tokens: float
    latency_s: float = Field(description="Mean seconds per sample, re-ask included.")


class Timing(BaseModel):
    wall_time_s: float = Field(description="Summed over sessions: session start to last sample.")
    sessions: int
    completion_tokens: int
    tokens_per_s: float | None
    mean_latency_s: float | None
    created_at: float


class EvalReport(BaseModel):
    """Result of one GPQA evaluation (``report.json``)."""

    schema_version: int = SCHEMA_VERSION
    benchmark: str = "gpqa"
    endpoint: str
    model: str
    dataset_path: str
    dataset_sha256: str
    protocol: dict[str, Any]
    accuracy: float | None = Field(description="Lenient pass@1: any rule, re-ask included.")
    ci95_low: float | None
    ci95_high: float | None
    ci_method: str
    n_questions: int
    n_samples: int
    repeats: int
    strict: Accuracy = Field(description="Only `ANSWER: X` on the main response counts.")
    lenient: Accuracy
    by_domain: list[GroupResult]
    by_subdomain: list[GroupResult]
    rates: Rates
    reference_accuracy: float | None
    questions: list[QuestionResult]
    timing: Timing


def build_report(
    contents: LogContents,
    *,
    expected_keys: set[str] | None = None,
    reference_accuracy: float | None = PUBLISHED_REFERENCE,
    now: float | None = None,
) -> EvalReport:
    """Score every logged sample again and aggregate. ``expected_keys`` limits the report to
    the samples of this run (a log may hold more, e.g. from a larger ``--limit``)."""
    records = [
        s for s in _unique(contents.samples) if expected_keys is None or s.key in expected_keys
    ]
    scored = [score_sample(r) for r in records]
    lenient = accuracy_of(scored)
    strict = accuracy_of(scored, strict=True)
    n = len(scored) or 1
    rules: dict[str, int] = defaultdict(int)
    for s in scored:
        rules[s.rule] += 1
    header = contents.header
    return EvalReport(
        endpoint=header.protocol.endpoint,
        model=header.protocol.model,
        dataset_path=header.dataset_path,
        dataset_sha256=header.protocol.dataset_sha256,
        protocol=header.protocol.model_dump(mode="json"),
        accuracy=lenient.accuracy,
        ci95_low=lenient.ci95_low,
        ci95_high=lenient.ci95_high,
        ci_method=lenient.method,
        n_questions=lenient.n_questions,
        n_samples=len(scored),
        repeats=max((s.repeat for s in scored), default=-1) + 1,
        strict=strict,
        lenient=lenient,
        by_domain=_groups(scored, lambda s: s.domain),
        by_subdomain=_groups(scored, lambda s: f"{s.domain} / {s.subdomain}"),
        rates=Rates(
            truncated=sum(s.truncated for s in scored) / n,
            reasked=sum(s.reasked for s in scored) / n,
            fallback=sum(s.fallback_used for s in scored) / n,
            unparsed=sum(s.letter is None for s in scored) / n,
            errors=sum(s.error is not None for s in scored) / n,
            rules=dict(sorted(rules.items())),
        ),
        reference_accuracy=reference_accuracy,
        questions=_questions(scored),
        timing=_timing(contents, records, scored, now if now is not None else time.time()),
    )


def _unique(samples: list[SampleRecord]) -> list[SampleRecord]:
    seen: dict[str, SampleRecord] = {}
    for s in samples:
        seen.setdefault(s.key, s)
    return list(seen.values())


def _groups(scored: list[ScoredSample], name_of: Any) -> list[GroupResult]:
    names = sorted({name_of(s) for s in scored})
    return [
        GroupResult(
            name=name,
            accuracy=accuracy_of(s for s in scored if name_of(s) == name),
        )
        for name in names
    ]


def _questions(scored: list[ScoredSample]) -> list[QuestionResult]:
    by_id: dict[str, list[ScoredSample]] = {}
    for s in sorted(scored, key=lambda s: s.repeat):
        by_id.setdefault(s.record_id, []).append(s)
    return [
        QuestionResult(
            record_id=rid,
            domain=ss[0].domain,
            subdomain=ss[0].subdomain,
            n_samples=len(ss),
            n_correct=sum(s.correct for s in ss),
            answers=[s.letter for s in ss],
            correct_letters=[s.correct_letter for s in ss],
            rules=[s.rule for s in ss],
            truncated=sum(s.truncated for s in ss),
            mean_completion_tokens=sum(s.completion_tokens for s in ss) / len(ss),
            latency_s=sum(s.latency_s for s in ss) / len(ss),
        )
        for rid, ss in sorted(by_id.items())
    ]


def _timing(
    contents: LogContents, records: list[SampleRecord], scored: list[ScoredSample], now: float
) -> Timing:
    wall = 0.0
    for session in contents.sessions:
        ends = [r.finished_at for r in records if r.session == session.index]
        if ends:
            wall += max(ends) - session.started_at
    tokens = sum(s.completion_tokens for s in scored)
    return Timing(
        wall_time_s=wall,
        sessions=len(contents.sessions),
        completion_tokens=tokens,
        tokens_per_s=tokens / wall if wall > 0 else None,
        mean_latency_s=(sum(s.latency_s for s in scored) / len(scored) if scored else None),
        created_at=now,
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _acc(a: Accuracy) -> str:
    return f"{_pct(a.accuracy)} [{_pct(a.ci95_low)}, {_pct(a.ci95_high)}]"


def render_markdown(report: EvalReport) -> str:
    """A human summary of the report, for a terminal or a pull request."""
    r = report
    lines = [
        f"# GPQA eval: {r.model}",
        "",
        f"- endpoint: {r.endpoint}",
        f"- data set: {r.dataset_path} (sha256 {r.dataset_sha256[:12]}), "
        f"{r.n_questions} questions × {r.repeats} repeat(s) = {r.n_samples} samples",
        f"- accuracy (lenient, pass@1): **{_acc(r.lenient)}** 95% CI ({r.ci_method})",
        f"- accuracy (strict `ANSWER: X` only): {_acc(r.strict)}",
        f"- published reference: {_pct(r.reference_accuracy)}",
        f"- truncated {_pct(r.rates.truncated)} · re-asked {_pct(r.rates.reasked)} "
        f"(answered by the re-ask {_pct(r.rates.fallback)}) · "
        f"unparsed {_pct(r.rates.unparsed)} · errors {_pct(r.rates.errors)}",
        "- rules: " + ", ".join(f"{k} {v}" for k, v in r.rates.rules.items()),
        f"- wall time {r.timing.wall_time_s:.1f} s over {r.timing.sessions} session(s), "
        f"{r.timing.completion_tokens} completion tokens"
        + (f", {r.timing.tokens_per_s:.1f} tokens/s" if r.timing.tokens_per_s else ""),
        "",
        "| group | accuracy | 95% CI | questions |",
        "|---|---|---|---|",
    ]
    for group in [*r.by_domain, *r.by_subdomain]:
        a = group.accuracy
        lines.append(
            f"| {group.name} | {_pct(a.accuracy)} | {_pct(a.ci95_low)}–"
            f"{_pct(a.ci95_high)} | {a.n_questions} |"
        )
    return "\n".join(lines) + "\n"


def render_html(report: EvalReport, samples: list[SampleRecord]) -> str:
    """One static page: the summary, then every sample with its reasoning collapsed."""
    e = html.escape
    keep = {q.record_id for q in report.questions}
    parts = [
        "<!doctype html><meta charset=utf-8><title>GPQA eval</title>",
        "<style>body{font-family:sans-serif;max-width:70em;margin:auto}"
        "pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em}"
        ".ok{color:#070}.bad{color:#a00}</style>",
        f"<pre>{e(render_markdown(report))}</pre>",
    ]
    for record in sorted(_unique(samples), key=lambda s: (s.record_id, s.repeat)):
        if record.record_id not in keep:
            continue
        s = score_sample(record)
        verdict = "ok" if s.correct else "bad"
        parts.append(
            f"<h3 class={verdict}>{e(record.record_id)} · repeat {record.repeat} · answer "
            f"{e(str(s.letter))} ({e(s.rule)}) · correct {e(record.correct_letter)}"
            f"{' · truncated' if s.truncated else ''}</h3>"
            f"<p>{e(record.domain)} / {e(record.subdomain)} · {s.completion_tokens} tokens · "
            f"{s.latency_s:.1f} s</p>"
            f"<details><summary>prompt</summary><pre>{e(record.prompt)}</pre></details>"
            f"<details><summary>reasoning ({len(record.response.reasoning)} chars)</summary>"
            f"<pre>{e(record.response.reasoning)}</pre></details>"
            f"<pre>{e(record.response.content or record.response.error or '')}</pre>"
        )
        if record.fallback is not None:
            parts.append(
                f"<details><summary>fallback re-ask</summary>"
                f"<pre>{e(record.fallback.content or record.fallback.error or '')}"
                f"</pre></details>"
            )
    return "\n".join(parts) + "\n"


def write_reports(
    report: EvalReport,
    samples: list[SampleRecord],
    out_dir: Path,
    redactor: Redactor | None = None,
) -> None:
    """Write ``report.json``, ``report.md`` and ``report.html`` into ``out_dir``, through the
    one writing path (``tandem.files``: atomic, redacted with ``redactor``, default the
    caller's)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files.write_json(out_dir / "report.json", report, redactor=redactor)
    files.write_text(out_dir / "report.md", render_markdown(report), redactor=redactor)
    files.write_text(out_dir / "report.html", render_html(report, samples), redactor=redactor)
