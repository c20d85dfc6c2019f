"""Views of a bench summary: terminal tables, a Markdown report, PNG plots, comparisons.

Everything here renders from ``BenchResult`` / ``Comparison`` (and, for distributions, the
``RequestRecord`` s of ``requests.jsonl``); nothing measures. Times are shown in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from tandem.bench.compare import Comparison
from tandem.bench.load_generator import BenchResult, LoadPointResult
from tandem.bench.metrics import LatencyStats, tpot_s
from tandem.bench.records import RequestRecord
from tandem.bench.server_metrics import ServerDelta

REPORT_FILE = "report.md"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _load(p: LoadPointResult) -> str:
    point = p.point
    if point.kind == "rate":
        cap = f", max {point.concurrency}" if point.concurrency else ""
        return f"{point.rate_rps:g} req/s{cap}"
    if point.kind == "long-context":
        return f"long context ({point.input_tokens} in)"
    return f"concurrency {point.concurrency}"


SUMMARY_COLUMNS = (
    "point",
    "load",
    "ok/sent",
    "TTFT p50",
    "TTFT p99",
    "srv TTFT mean",
    "TPOT p50",
    "TPOT p99",
    "ITL p50",
    "E2EL p50",
    "out tok/s",
    "tok/chunk",
    "server gen tok",
)


def summary_rows(result: BenchResult) -> list[list[str]]:
    """One row per load point, in SUMMARY_COLUMNS order (latencies in ms)."""
    rows = []
    for p in result.points:
        m = p.metrics
        rows.append(
            [
                p.point.label,
                _load(p),
                f"{m.completed}/{m.requests}",
                _ms(m.ttft_s.p50),
                _ms(m.ttft_s.p99),
                _ms(p.server.ttft_mean_s if p.server else None),
                _ms(m.tpot_s.p50),
                _ms(m.tpot_s.p99),
                _ms(m.itl_s.p50),
                _ms(m.e2el_s.p50),
                _num(m.output_throughput_tok_s),
                _num(m.tokens_per_chunk.mean, 2),
                str(p.server.generation_tokens)
                if p.server and p.server.generation_tokens is not None
                else "–",
            ]
        )
    return rows


def summary_table(result: BenchResult) -> Table:
    """The run as a rich table: one row per load point."""
    table = Table(
        title=f"tandem bench · {result.server.model} · {result.config.endpoint} · "
        f"{result.config.input_tokens} in / {result.config.output_tokens} out "
        "(latencies in ms)"
    )
    for i, name in enumerate(SUMMARY_COLUMNS):
        table.add_column(name, justify="left" if i < 2 else "right")
    for row in summary_rows(result):
        table.add_row(*row)
    return table


def _stats_row(name: str, s: LatencyStats) -> str:
    cells = [_ms(s.mean), _ms(s.std), _ms(s.p50), _ms(s.p90), _ms(s.p99), _ms(s.max)]
    return f"| {name} | {s.count} | " + " | ".join(cells) + " |"


def markdown(result: BenchResult) -> str:
    """The whole run as a Markdown report."""
    c = result.config
    lines = [
        f"# tandem bench: {result.server.model}",
        "",
        f"- Server: {result.server.url} (vLLM {result.server.version or 'unknown'}, "
        f"max_model_len {result.server.max_model_len or 'unknown'})",
        f"- Endpoint: `{c.endpoint}`; {c.input_tokens} input / {c.output_tokens} output tokens"
        f"{' (ignore_eos)' if c.ignore_eos else ''}; warm-up {c.warmup_requests} requests; "
        f"seed {c.seed}",
        f"- Run: {result.created_at:%Y-%m-%d %H:%M:%S} UTC, tandem {result.tandem_version}, "
        f"{'finished' if result.finished else 'NOT finished (killed or still running)'}",
        "",
        "TTFT: first token of any kind; srv TTFT mean: the server's own mean over the same "
        "requests (vLLM's histogram, Δ /metrics). TPOT: (E2EL − TTFT) / (output tokens − 1). "
        "ITL: gaps between token chunks, pooled. E2EL: last token chunk. Latencies in ms.",
        "",
        "| " + " | ".join(SUMMARY_COLUMNS) + " |",
        "|" + "---|" * len(SUMMARY_COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in summary_rows(result)]
    for w in result.warnings:
        lines += ["", f"> **Warning:** {w}"]
    for p in result.points:
        m, s = p.metrics, p.server
        lines += [
            "",
            f"## {p.point.label}: {_load(p)}",
            "",
            f"{m.completed} of {m.requests} requests completed in {_num(m.duration_s, 2)} s; "
            f"{m.output_tokens_total} output and {m.prompt_tokens_total} prompt tokens; "
            f"{_num(m.request_throughput_rps, 2)} req/s, "
            f"{_num(m.output_throughput_tok_s)} output tok/s; "
            f"peak {m.max_concurrent_requests} in flight.",
        ]
        if m.errors:
            lines.append("Errors: " + ", ".join(f"{k} × {v}" for k, v in m.errors.items()) + ".")
        if m.goodput_rps is not None:
            lines.append(f"Goodput (all SLOs met): {m.goodput_rps:.2f} req/s.")
        if p.decode_roofline_fraction is not None:
            lines.append(
                f"Single-stream decode speed is {p.decode_roofline_fraction:.0%} of the "
                "planner's roofline."
            )
        lines += [
            "",
            "| metric | n | mean | std | p50 | p90 | p99 | max |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, stats in (
            ("TTFT", m.ttft_s),
            ("TTFAT (answer)", m.ttfat_s),
            ("TPOT", m.tpot_s),
            ("ITL", m.itl_s),
            ("E2EL", m.e2el_s),
            ("client queue", m.queue_s),
        ):
            lines.append(_stats_row(name, stats))
        if s is not None:
            kv = s.kv_cache_usage_peak
            server = [
                f"generation tokens {s.generation_tokens}",
                f"prompt tokens {s.prompt_tokens}",
                f"preemptions {s.preemptions}",
                f"KV cache peak {_num(kv * 100 if kv is not None else None)} %",
            ]
            if s.spec_acceptance_rate is not None:
                server.append(
                    f"spec-decode acceptance {s.spec_acceptance_rate:.1%}, length "
                    f"{_num(s.spec_acceptance_length, 2)}"
                )
            lines += ["", "Server counters (Δ /metrics): " + "; ".join(server) + "."]
            if (said := _server_ttft(s, m.ttft_s.mean)) is not None:
                lines.append(said)
        for w in p.warnings:
            lines += ["", f"> **Warning:** {w}"]
    return "\n".join(lines) + "\n"


def _server_ttft(s: ServerDelta, client_mean: float | None) -> str | None:
    """The server's own mean TTFT beside the client's: what the HTTP path and client add.
    None when the server exports no TTFT."""
    server_mean = s.ttft_mean_s
    if server_mean is None:
        return None
    text = (
        f"The server's own TTFT over its {s.ttft_requests} requests: mean "
        f"{_ms(server_mean)} ms (scheduler queue {_ms(s.queue_mean_s)}, prefill "
        f"{_ms(s.prefill_mean_s)})"
    )
    if client_mean is None:
        return text + "."
    return (
        f"{text}; the client's mean {_ms(client_mean)} ms, so the HTTP path and the client add "
        f"{_ms(client_mean - server_mean)} ms."
    )


def _pct(rel: float | None) -> str:
    return "–" if rel is None else f"{rel:+.1%}"


def comparison_rows(comp: Comparison) -> list[list[str]]:
    rows = []
    for point in comp.points:
        for f in point.figures:
            seconds = f.unit == "s"
            fmt = _ms if seconds else _num
            rows.append(
                [
                    point.label,
                    f.name + (" (ms)" if seconds else ""),
                    fmt(f.a),
                    fmt(f.b),
                    _pct(f.relative),
                    {"a": "A", "b": "B"}.get(f.better or "", ""),
                ]
            )
    return rows


COMPARISON_COLUMNS = ("point", "figure", "A", "B", "B vs A", "better")


def comparison_table(comp: Comparison) -> Table:
    table = Table(title=f"A = {comp.a}   B = {comp.b}")
    for i, name in enumerate(COMPARISON_COLUMNS):
        table.add_column(name, justify="left" if i < 2 else "right")
    for row in comparison_rows(comp):
        table.add_row(*row)
    return table


def settings_warning(comp: Comparison) -> str:
    """The settings the two runs differ in, with both values; empty when none."""
    if not comp.settings_differ:
        return ""
    differ = ", ".join(f"{d.name} (A {d.a!r}, B {d.b!r})" for d in comp.settings_differ)
    return f"the runs were measured with different settings, which move the figures too: {differ}"


def comparison_markdown(comp: Comparison) -> str:
    lines = [
        "# tandem bench compare",
        "",
        f"- A: {comp.a}",
        f"- B: {comp.b}",
        "",
        "| " + " | ".join(COMPARISON_COLUMNS) + " |",
        "|" + "---|" * len(COMPARISON_COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in comparison_rows(comp)]
    if comp.settings_differ:
        lines += ["", f"**Warning**: {settings_warning(comp)}."]
    if comp.only_in_a or comp.only_in_b:
        lines += [
            "",
            f"Only in A: {', '.join(comp.only_in_a) or 'none'}; only in B: "
            f"{', '.join(comp.only_in_b) or 'none'}.",
        ]
    return "\n".join(lines) + "\n"


def write_plots(result: BenchResult, records: Sequence[RequestRecord], out_dir: Path) -> list[Path]:
    """PNG plots: latency and throughput against load, and latency distributions (CDFs).

    Returns the files written.
    """
    # matplotlib costs ~0.5 s of CPU to import; only runs that draw plots pay it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ladder = [p for p in result.points if p.point.kind == "concurrency"]
    if ladder:
        x = [p.point.concurrency for p in ladder if p.point.concurrency is not None]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, attr in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2EL", "e2el_s")):
            for q, style in (("p50", "-o"), ("p99", "--")):
                ys = [getattr(getattr(p.metrics, attr), q) for p in ladder]
                ax.plot(
                    x,
                    [y * 1000 if y is not None else float("nan") for y in ys],
                    style,
                    label=f"{name} {q}",
                )
        ax.set(
            xlabel="concurrency",
            ylabel="ms",
            title="Latency against concurrency",
            xscale="log",
            yscale="log",
        )
        ax.set_xticks(x, [str(v) for v in x])
        ax.legend(fontsize=8)
        written.append(_save(fig, out_dir / "latency_vs_concurrency.png", plt))
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(
            x,
            [p.metrics.output_throughput_tok_s or float("nan") for p in ladder],
            "-o",
            label="output tok/s (all streams)",
        )
        per_user = [
            1 / p.metrics.tpot_s.p50 if p.metrics.tpot_s.p50 else float("nan") for p in ladder
        ]
        ax.plot(x, per_user, "-s", label="tok/s per stream (1 / TPOT p50)")
        ax.set(
            xlabel="concurrency",
            ylabel="tokens/s",
            title="Throughput against concurrency",
            xscale="log",
        )
        ax.set_xticks(x, [str(v) for v in x])
        ax.legend(fontsize=8)
        written.append(_save(fig, out_dir / "throughput_vs_concurrency.png", plt))
    if records:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for label in [p.point.label for p in result.points]:
            mine = [r for r in records if r.load_point == label and r.ok]
            for ax, values in (
                (axes[0], [r.ttft_s for r in mine]),
                (axes[1], [tpot_s(r) for r in mine]),
            ):
                data = sorted(v * 1000 for v in values if v is not None)
                if data:
                    ax.step(
                        data,
                        [(i + 1) / len(data) for i in range(len(data))],
                        where="post",
                        label=label,
                    )
        axes[0].set(xlabel="TTFT (ms)", ylabel="fraction of requests", title="TTFT distribution")
        axes[1].set(xlabel="TPOT (ms)", title="TPOT distribution")
        for ax in axes:
            ax.legend(fontsize=8)
        written.append(_save(fig, out_dir / "latency_cdf.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
