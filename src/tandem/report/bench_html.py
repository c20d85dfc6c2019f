"""A bench run as one HTML file that opens offline, and its load points as CSV.

``report.html`` holds the run's tables (the summary, the depth sweep, the rounds) and its plots
(the PNGs ``write_plots`` draws, embedded as ``data:`` URIs): one file to mail or attach to an
issue, with no script, stylesheet or font fetched from anywhere. ``points.csv`` has one row a
load point and round, in numbers (seconds, tokens/s), for a spreadsheet or pandas.
"""

from __future__ import annotations

import base64
import csv
import html
import io
from collections.abc import Sequence
from pathlib import Path

from tandem.bench.load_generator import BenchResult, LoadPointResult
from tandem.report.bench import (
    DEPTH_COLUMNS,
    SUMMARY_COLUMNS,
    depth_rows,
    run_facts,
    summary_rows,
)

HTML_FILE = "report.html"
CSV_FILE = "points.csv"

CSV_FIELDS = {
    "point": "point.label",
    "round": "point.round",
    "kind": "point.kind",
    "concurrency": "point.concurrency",
    "rate_rps": "point.rate_rps",
    "depth_tokens": "point.depth_tokens",
    "input_tokens": "point.input_tokens",
    "output_tokens": "point.output_tokens",
    "requests": "metrics.requests",
    "completed": "metrics.completed",
    "duration_s": "metrics.duration_s",
    "request_throughput_rps": "metrics.request_throughput_rps",
    "output_throughput_tok_s": "metrics.output_throughput_tok_s",
    "goodput_rps": "metrics.goodput_rps",
    "ttft_p50_s": "metrics.ttft_s.p50",
    "ttft_p90_s": "metrics.ttft_s.p90",
    "ttft_p99_s": "metrics.ttft_s.p99",
    "tpot_p50_s": "metrics.tpot_s.p50",
    "tpot_p90_s": "metrics.tpot_s.p90",
    "tpot_p99_s": "metrics.tpot_s.p99",
    "itl_p50_s": "metrics.itl_s.p50",
    "e2el_p50_s": "metrics.e2el_s.p50",
    "e2el_p99_s": "metrics.e2el_s.p99",
    "prefill_tok_s_p50": "metrics.prefill_tok_s.p50",
    "decode_tok_s_p50": "metrics.decode_tok_s.p50",
    "server_prompt_tokens": "server.prompt_tokens",
    "server_generation_tokens": "server.generation_tokens",
    "prefix_cache_hit_rate": "server.prefix_cache_hit_rate",
}
"""points.csv's columns, each with where it is read in a ``LoadPointResult`` (empty where a
part is missing: the server's counters of a point without them)."""

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) { text-align: left; }
th { background: #f3f3f3; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
.warning { background: #fff4d6; padding: 0.4em 0.8em; border-left: 4px solid #e0a800; }
"""


def _table(columns: Sequence[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    name = html.escape(path.stem.replace("_", " "))
    return (
        f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
        f"<figcaption>{name}</figcaption></figure>"
    )


def html_report(result: BenchResult, plots: Sequence[Path] = ()) -> str:
    """The run as a self-contained HTML page: settings, tables, warnings, the plots."""
    title = f"tandem bench: {result.server.model}"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in run_facts(result)) + "</ul>",
        "<h2>Load points</h2>",
        "<p>Latencies in ms. TTFT: first token of any kind; TPOT: (E2EL − TTFT) / (output "
        "tokens − 1); ITL: gaps between token chunks, pooled; E2EL: last token chunk.</p>",
        _table(SUMMARY_COLUMNS, summary_rows(result)),
    ]
    if rows := depth_rows(result):
        parts += [
            "<h2>Context depth</h2>",
            "<p>llama-benchy's pp and tg, per-request medians: pp = prompt tokens / TTFT, "
            "tg = 1 / TPOT; TTFT in ms.</p>",
            _table(DEPTH_COLUMNS, rows),
        ]
    warnings = result.warnings + [w for p in result.points for w in p.warnings]
    parts += [f'<p class="warning">{html.escape(w)}</p>' for w in warnings]
    if plots:
        parts.append("<h2>Plots</h2>")
        parts += [_figure(p) for p in plots]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def points_csv(result: BenchResult) -> str:
    """One CSV row a load point and round, in CSV_FIELDS order (empty where unknown)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for p in result.points:
        writer.writerow("" if (v := _field(p, path)) is None else v for path in CSV_FIELDS.values())
    return out.getvalue()


def _field(point: LoadPointResult, path: str) -> object:
    """The value at a dotted ``path`` of ``point``; None where a part of the path is None."""
    value: object = point
    for name in path.split("."):
        value = None if value is None else getattr(value, name)
    return value
