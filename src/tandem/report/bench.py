"""Views of a bench summary: terminal tables, a Markdown report, PNG plots, comparisons.

Everything here renders from ``BenchResult`` / ``Comparison`` (and, for distributions, the
``RequestRecord`` s of ``requests.jsonl``); nothing measures. Times are shown in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from pathlib import Path

from rich.table import Table

from tandem.bench.compare import Comparison, FigureDiff
from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import BenchResult, LoadPointResult
from tandem.bench.metrics import LatencyStats, LoadPointMetrics, tpot_s
from tandem.bench.records import RequestRecord
from tandem.bench.rounds import PointRounds, rounds_summary
from tandem.bench.server_metrics import ServerDelta
from tandem.bench.slo_search import SloSearch
from tandem.bench.stats import MedianCI, median_ci

REPORT_FILE = "report.md"
SLO_REPORT_FILE = "slo.md"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _markdown_table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown pipe table's lines: every table of the reports is written this one way."""
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _rich_table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *, left: int = 0
) -> Table:
    """The terminal's form of a report table: the first ``left`` columns (names) flush left,
    the figures flush right so their digits line up."""
    table = Table(title=title)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i < left else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _load(p: LoadPointResult) -> str:
    point = p.point
    if point.kind == "rate":
        cap = f", max {point.concurrency}" if point.concurrency else ""
        return f"{point.rate_rps:g} req/s{cap}"
    if point.kind == "long-context":
        return f"long context ({point.input_tokens} in)"
    depth = f", depth {point.depth_tokens}" if point.depth_tokens else ""
    return f"concurrency {point.concurrency}{depth}"


def _label(p: LoadPointResult, rounds: int) -> str:
    return f"{p.point.label} #{p.point.round}" if rounds > 1 else p.point.label


def workload(config: BenchConfig) -> str:
    """The prompts of a run in a few words: ``128 in / 128 out tokens``, a prefix, turns, a
    file, rounds."""
    if config.prompt_file:
        text = f"prompts from {config.prompt_file}, {config.output_tokens} out tokens"
    else:
        text = f"{config.input_tokens} in / {config.output_tokens} out tokens"
        if config.prefix_tokens:
            groups = config.prefix_groups
            text = (
                f"{config.prefix_tokens}-token prefix shared in {groups} "
                f"group{'s' if groups > 1 else ''} + {text}"
            )
    if config.depths:
        text = f"context depths {', '.join(map(str, config.depths))} + {text}"
    if config.turns > 1:
        text += f", {config.turns} turns"
    if config.rounds > 1:
        text += f", {config.rounds} rounds"
    return text


def prefix_hit(server: ServerDelta | None) -> str:
    """The prefix cache hit rate of a point, "off" when the server caches no prefixes."""
    if server is None:
        return "–"
    if server.prefix_cache_hit_rate is not None:
        return f"{server.prefix_cache_hit_rate:.1%}"
    return "off" if server.prefix_caching is False else "–"


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
    "prefix hit",
)


def summary_rows(result: BenchResult) -> list[list[str]]:
    """One row per load point, in SUMMARY_COLUMNS order (latencies in ms)."""
    rows = []
    for p in result.points:
        m = p.metrics
        rows.append(
            [
                _label(p, result.config.rounds),
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
                prefix_hit(p.server),
            ]
        )
    return rows


def summary_table(result: BenchResult) -> Table:
    """The run as a rich table: one row per load point."""
    return _rich_table(
        f"tandem bench · {result.server.model} · {result.config.endpoint} · "
        f"{workload(result.config)} (latencies in ms)",
        SUMMARY_COLUMNS,
        summary_rows(result),
        left=2,
    )


DEPTH_COLUMNS = ("depth", "c", "prompt tok", "TTFT p50", "pp tok/s", "tg tok/s", "out tok/s")
"""The depth sweep in llama-benchy's terms: per-request medians of prefill (pp) and decode (tg)
speed at each context depth and concurrency; out tok/s is the point's total."""


def depth_rows(result: BenchResult) -> list[list[str]]:
    """One row per point of a depth sweep, in DEPTH_COLUMNS order; empty for other runs."""
    if not result.config.depths:
        return []
    return [
        [
            str(p.point.depth_tokens),
            str(p.point.concurrency),
            _num(p.metrics.prompt_tokens.p50, 0),
            _ms(p.metrics.ttft_s.p50),
            _num(p.metrics.prefill_tok_s.p50),
            _num(p.metrics.decode_tok_s.p50),
            _num(p.metrics.output_throughput_tok_s),
        ]
        for p in result.points
        if p.point.kind == "concurrency"
    ]


def depth_table(result: BenchResult) -> Table | None:
    """The depth sweep as a rich table, or None when the run has no depths."""
    rows = depth_rows(result)
    if not rows:
        return None
    title = "context depth: per-request medians (pp = prefill, tg = decode)"
    return _rich_table(title, DEPTH_COLUMNS, rows)


def _depth_markdown(result: BenchResult) -> list[str]:
    rows = depth_rows(result)
    if not rows:
        return []
    return [
        "",
        "Context depth (llama-benchy's pp and tg, per-request medians: pp = prompt tokens / "
        "TTFT, tg = 1 / TPOT; TTFT in ms):",
        "",
        *_markdown_table(DEPTH_COLUMNS, rows),
    ]


ROUND_FIGURES = ("ttft_p50_s", "tpot_p50_s", "e2el_p50_s", "output_throughput_tok_s")
"""The figures the terminal's rounds table shows (report.md shows every headline figure)."""


def _ci(ci: MedianCI, unit: str) -> str:
    fmt = _ms if unit == "s" else _num
    if ci.low is None or ci.high is None or ci.confidence is None:
        return fmt(ci.median)
    return f"{fmt(ci.median)} ({fmt(ci.low)}, {fmt(ci.high)}) {ci.confidence:.0%}"


def rounds_table(result: BenchResult) -> Table | None:
    """Per point, a few figures' medians over the rounds with their intervals; None for one
    round."""
    if result.config.rounds < 2:
        return None
    summary = rounds_summary(result)
    names = [summary[0].figure(key).name if summary else key for key in ROUND_FIGURES]
    return _rich_table(
        "median over the rounds, its distribution-free interval (low, high) and that "
        "interval's confidence; latencies in ms",
        ["point", "rounds", *names],
        (
            [point.label, str(point.rounds)]
            + [_ci(point.figure(k).median, point.figure(k).unit) for k in ROUND_FIGURES]
            for point in summary
        ),
        left=1,
    )


def _rounds_markdown(summary: list[PointRounds]) -> list[str]:
    lines = [
        "",
        "## Rounds",
        "",
        "Each figure's median over the rounds, and the order-statistic interval around it: "
        "[x(k), x(n+1−k)] of the n sorted round values, which holds the true median with the "
        "confidence shown (1 − 2·P(Binomial(n, ½) < k); below 6 rounds it cannot reach 95 %, "
        "and the interval is the rounds' range). Latencies in ms.",
        "",
    ]
    rows = []
    for point in summary:
        for f in point.figures:
            fmt = _ms if f.unit == "s" else _num
            ci = f.median
            conf = "–" if ci.confidence is None else f"{ci.confidence:.1%}"
            rows.append(
                [point.label, f.name, str(ci.n), fmt(ci.median), fmt(ci.low), fmt(ci.high), conf]
            )
    return lines + _markdown_table(
        ("point", "figure", "rounds", "median", "low", "high", "confidence"), rows
    )


def _turns_markdown(m: LoadPointMetrics) -> list[str]:
    if not m.turns:
        return []
    columns = ("turn", "ok/sent", "prompt tokens p50", "TTFT mean", "TTFT p50", "TTFT p90")
    rows = (
        [str(t.turn), f"{t.completed}/{t.requests}", _num(t.prompt_tokens.p50, 0)]
        + [_ms(s) for s in (t.ttft_s.mean, t.ttft_s.p50, t.ttft_s.p90, t.ttft_s.p99)]
        for t in m.turns
    )
    return [
        "",
        "TTFT per turn (a turn's prompt holds every earlier turn and answer):",
        "",
        *_markdown_table((*columns, "TTFT p99"), rows),
    ]


def _dataset_markdown(result: BenchResult) -> list[str]:
    d = result.dataset
    if d is None:
        return []
    t = d.prompt_tokens
    return [
        "",
        f"Prompts: {d.sent} conversations from {d.distinct} of the {d.rows} rows of `{d.file}` "
        f"({d.format}), in the seed's order; {d.too_long} of {d.measured} measured rows left "
        f"out as too long. Their tokens by the server's tokenizer: mean {_num(t.mean)}, p50 "
        f"{_num(t.p50, 0)}, p90 {_num(t.p90, 0)}, max {_num(t.max, 0)}.",
    ]


def _prefix_text(s: ServerDelta) -> str | None:
    if s.prefix_cache_hit_rate is not None:
        return (
            f"prefix cache hit rate {s.prefix_cache_hit_rate:.1%} ({s.prefix_cache_hits} of "
            f"{s.prefix_cache_queries} prompt tokens found cached)"
        )
    if s.prefix_caching is False:
        return "prefix caching off on the server"
    return None


def _latency_markdown(m: LoadPointMetrics) -> list[str]:
    """A point's latency distributions, a row per figure, in ms."""
    figures: tuple[tuple[str, LatencyStats], ...] = (
        ("TTFT", m.ttft_s),
        ("TTFAT (answer)", m.ttfat_s),
        ("TPOT", m.tpot_s),
        ("ITL", m.itl_s),
        ("E2EL", m.e2el_s),
        ("client queue", m.queue_s),
    )
    rows = (
        [name, str(s.count)] + [_ms(v) for v in (s.mean, s.std, s.p50, s.p90, s.p99, s.max)]
        for name, s in figures
    )
    return ["", *_markdown_table(("metric", "n", "mean", "std", "p50", "p90", "p99", "max"), rows)]


def _server_markdown(s: ServerDelta, client_ttft_mean: float | None) -> list[str]:
    """A point's server counters (Δ /metrics) and the server's TTFT beside the client's."""
    kv = s.kv_cache_usage_peak
    server = [
        f"generation tokens {s.generation_tokens}",
        f"prompt tokens {s.prompt_tokens}",
        f"preemptions {s.preemptions}",
        f"KV cache peak {_num(kv * 100 if kv is not None else None)} %",
    ]
    if (prefix := _prefix_text(s)) is not None:
        server.append(prefix)
    if s.spec_acceptance_rate is not None:
        server.append(
            f"spec-decode acceptance {s.spec_acceptance_rate:.1%}, length "
            f"{_num(s.spec_acceptance_length, 2)}"
        )
    lines = ["", "Server counters (Δ /metrics): " + "; ".join(server) + "."]
    if (said := _server_ttft(s, client_ttft_mean)) is not None:
        lines.append(said)
    return lines


def run_facts(result: BenchResult, code: str = "") -> list[str]:
    """The header of report.md and report.html; ``code`` goes around the endpoint's name."""
    c = result.config
    return [
        f"Server: {result.server.url} (vLLM {result.server.version or 'unknown'}, "
        f"max_model_len {result.server.max_model_len or 'unknown'})",
        f"Endpoint: {code}{c.endpoint}{code}; {workload(c)}"
        f"{' (ignore_eos)' if c.ignore_eos else ''}; warm-up {c.warmup_requests} requests; "
        f"seed {c.seed}",
        f"Run: {result.created_at:%Y-%m-%d %H:%M:%S} UTC, tandem {result.tandem_version}, "
        f"{'finished' if result.finished else 'NOT finished (killed or still running)'}",
    ]


def markdown(result: BenchResult) -> str:
    """The whole run as a Markdown report."""
    c = result.config
    lines = [
        f"# tandem bench: {result.server.model}",
        "",
        *(f"- {fact}" for fact in run_facts(result, "`")),
        "",
        "TTFT: first token of any kind; srv TTFT mean: the server's own mean over the same "
        "requests (vLLM's histogram, Δ /metrics). TPOT: (E2EL − TTFT) / (output tokens − 1). "
        "ITL: gaps between token chunks, pooled. E2EL: last token chunk. Latencies in ms.",
        "",
        *_markdown_table(SUMMARY_COLUMNS, summary_rows(result)),
    ]
    lines += _depth_markdown(result)
    lines += _dataset_markdown(result)
    for w in result.warnings:
        lines += ["", f"> **Warning:** {w}"]
    for p in result.points:
        m, s = p.metrics, p.server
        lines += [
            "",
            f"## {_label(p, c.rounds)}: {_load(p)}",
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
        lines += _latency_markdown(m) + _turns_markdown(m)
        if s is not None:
            lines += _server_markdown(s, m.ttft_s.mean)
        for w in p.warnings:
            lines += ["", f"> **Warning:** {w}"]
    if c.rounds > 1:
        lines += _rounds_markdown(rounds_summary(result))
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


def _noise(f: FigureDiff) -> str:
    """Whether B − A is beyond the rounds' noise, with the interval of the shift."""
    n = f.noise
    if n is None:
        return ""
    if n.verdict == "too-few-rounds":
        return f"? ({n.rounds_a} vs {n.rounds_b} rounds)"
    fmt = _ms if f.unit == "s" else _num
    word = "beyond" if n.verdict == "beyond-noise" else "within"
    return f"{word} [{fmt(n.low)}, {fmt(n.high)}]"


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
                    _noise(f),
                ]
            )
    return rows


COMPARISON_COLUMNS = ("point", "figure", "A", "B", "B vs A", "better", "noise")


def verdict_text(comp: Comparison) -> str:
    """One line: the figures B made worse (or better) beyond the noise, or that none are."""
    verdict = comp.verdict()
    level = f"{comp.confidence:.0%}"

    def names(refs: list) -> str:
        return ", ".join(f"{r.label} {r.figure.name} ({_pct(r.figure.relative)})" for r in refs)

    parts = []
    if verdict.worse:
        parts.append(f"B is worse beyond the noise ({level}) in {names(verdict.worse)}")
    if verdict.better:
        parts.append(f"B is better beyond the noise ({level}) in {names(verdict.better)}")
    if not parts:
        parts.append(f"no difference beyond the noise ({level})")
    if verdict.undecided:
        parts.append(
            f"{len(verdict.undecided)} figures have too few rounds to tell (4 a side at least "
            "for 95 %: `--rounds`)"
        )
    return "; ".join(parts)


def comparison_table(comp: Comparison) -> Table:
    return _rich_table(
        f"A = {comp.a}   B = {comp.b}", COMPARISON_COLUMNS, comparison_rows(comp), left=2
    )


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
        *_markdown_table(COMPARISON_COLUMNS, comparison_rows(comp)),
    ]
    lines += [
        "",
        "Noise: the distribution-free interval of the shift B − A over the rounds "
        f"(Hodges–Lehmann, Mann–Whitney, {comp.confidence:.0%}); beyond: it leaves out 0.",
        "",
        f"Verdict: {verdict_text(comp)}.",
    ]
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
    """PNG plots: latency and throughput against load, prefill and decode speed against
    context depth (a depth sweep; its concurrency plots are drawn at the first depth), and
    latency distributions (CDFs).

    Returns the files written.
    """
    # matplotlib costs ~0.5 s of CPU to import; only runs that draw plots pay it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {}
    if len(result.config.depths) > 1:
        figures["speed_vs_depth.png"] = _depth_plot(result, plt)
    figures |= _ladder_plots(result, plt)
    if records:
        figures["latency_cdf.png"] = _cdf_plot(result, records, plt)
    return [_save(fig, out_dir / name, plt) for name, fig in figures.items()]


def _medians(
    points: Iterable[Sequence[LoadPointResult]], figure: str, scale: float = 1.0
) -> list[float]:
    """A figure of the metrics (``"ttft_s.p50"``) at each point, times ``scale``: its median
    over the point's rounds (the figure itself for one round), as the rounds table takes it
    (``median_ci``); NaN where there is none, a gap in the plot."""
    read = attrgetter(figure)
    values = [
        median_ci([v for p in rounds if (v := read(p.metrics)) is not None]).median
        for rounds in points
    ]
    return [scale * v if v is not None else float("nan") for v in values]


def _ladder_plots(result: BenchResult, plt) -> dict:
    """Latency and throughput against the concurrency ladder (at the first depth of a depth
    sweep), by file name; none without concurrency points. The x axis is logarithmic, ticked
    at the ladder's own points (1, 2, 4, ... read as such, not as powers of ten)."""
    first_depth = result.config.depths[0] if result.config.depths else 0
    ladder = [
        rounds
        for rounds in map(result.rounds_of, result.labels())
        if rounds[0].point.kind == "concurrency" and rounds[0].point.depth_tokens == first_depth
    ]
    if not ladder:
        return {}
    x = [rounds[0].point.concurrency or 0 for rounds in ladder]
    latency, ax = plt.subplots(figsize=(7, 4.5))
    for name, attr in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2EL", "e2el_s")):
        ms = {q: _medians(ladder, f"{attr}.{q}", 1000) for q in ("p50", "p95", "p99")}
        (line,) = ax.plot(x, ms["p50"], "-o", label=f"{name} p50 (band to p95)")
        ax.fill_between(x, ms["p50"], ms["p95"], color=line.get_color(), alpha=0.2)
        ax.plot(x, ms["p99"], "--", color=line.get_color(), label=f"{name} p99")
    ax.set(ylabel="ms", title="Latency against concurrency", yscale="log")
    throughput, ax = plt.subplots(figsize=(7, 4.5))
    tok_s = _medians(ladder, "output_throughput_tok_s")
    ax.plot(x, tok_s, "-o", label="output tok/s (all streams)")
    per_user = [1 / t if t else float("nan") for t in _medians(ladder, "tpot_s.p50")]
    ax.plot(x, per_user, "-s", label="tok/s per stream (1 / TPOT p50)")
    ax.set(ylabel="tokens/s", title="Throughput against concurrency")
    for fig in (latency, throughput):
        fig.axes[0].set(xlabel="concurrency", xscale="log")
        fig.axes[0].set_xticks(x, [str(v) for v in x])
    return {"latency_vs_concurrency.png": latency, "throughput_vs_concurrency.png": throughput}


def _cdf_plot(result: BenchResult, records: Sequence[RequestRecord], plt):
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
    return fig


def _depth_plot(result: BenchResult, plt):
    """pp and tg (per-request medians) against context depth, a line per concurrency."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    depths = result.config.depths
    for c in result.config.concurrency:
        by_depth = {
            d: result.rounds_of(f"c{c}-d{d}") for d in depths if result.rounds_of(f"c{c}-d{d}")
        }
        for ax, attr in ((axes[0], "prefill_tok_s"), (axes[1], "decode_tok_s")):
            ys = _medians(by_depth.values(), f"{attr}.p50")
            ax.plot(list(by_depth), ys, "-o", label=f"concurrency {c}")
    axes[0].set(xlabel="context depth (tokens)", ylabel="tokens/s", title="Prefill (pp)")
    axes[1].set(xlabel="context depth (tokens)", title="Decode (tg), per stream")
    return fig


def _save(fig, path: Path, plt) -> Path:
    for ax in fig.axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


SLO_COLUMNS = ("concurrency", "held", "TTFT", "TPOT", "out tok/s", "goodput req/s", "failed")


def slo_rows(search: SloSearch) -> list[list[str]]:
    """One row per probe, by concurrency; TTFT and TPOT at the search's percentile, in ms."""
    return [
        [
            str(p.concurrency),
            "yes" if p.passed else "NO",
            _ms(p.ttft_s),
            _ms(p.tpot_s),
            _num(p.output_tok_s),
            _num(p.goodput_rps, 2),
            str(p.failed_requests),
        ]
        for p in sorted(search.probes, key=lambda p: p.concurrency)
    ]


def slo_verdict(search: SloSearch) -> str:
    """The search's answer in one sentence."""
    q = f"p{search.percentile}"
    goals = " and ".join(
        f"{q} {name} ≤ {_ms(limit)} ms"
        for name, limit in (("TTFT", search.ttft_s), ("TPOT", search.tpot_s))
        if limit is not None
    )
    best = search.best
    if best is None:
        text = f"no concurrency held {goals}, not even 1"
    else:
        probe = search.probe_at(best)
        above = (
            f"{search.first_failing} does not"
            if search.first_failing
            else f"the ceiling {search.ceiling} was reached"
        )
        goodput = f", goodput {_num(probe.goodput_rps, 2)} req/s" if probe else ""
        text = f"{goals} hold up to concurrency {best} ({above}){goodput}"
    if search.knee is not None:
        text += f"; throughput knee at concurrency {search.knee}"
    if search.out_of_order:
        text += (
            f"; concurrency {', '.join(map(str, search.out_of_order))} held above a failing one "
            "(the server is noisier than the margin: measure again with more --requests)"
        )
    return text + ("" if search.finished else " (search not finished)")


def slo_table(search: SloSearch) -> Table:
    return _rich_table(
        f"SLO search (p{search.percentile}, latencies in ms)", SLO_COLUMNS, slo_rows(search)
    )


def slo_markdown(search: SloSearch) -> str:
    return (
        "\n".join(
            [
                "# tandem bench: SLO search",
                "",
                f"{slo_verdict(search)}.",
                "",
                *_markdown_table(SLO_COLUMNS, slo_rows(search)),
                "",
                "Each probe is a run of its own in `cN/` (requests.jsonl, summary.json).",
            ]
        )
        + "\n"
    )
