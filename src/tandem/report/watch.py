"""Views of a watch: the live terminal panel, the Markdown summary, the PNG plots.

Everything renders from the samples (``tandem.watch.sample``), their series
(``tandem.watch.series``) or the summary (``tandem.watch.summary``); nothing here reads a node.
Plots mark each group restart with a red line and shade the samples whose verdict was not
``healthy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tandem import files
from tandem.errors import SpecError
from tandem.jsonfiles import JsonLines
from tandem.vllm_metrics import ERROR_REASONS
from tandem.watch.folder import read_run, read_samples
from tandem.watch.sample import Sample, WatchRun
from tandem.watch.series import GIB, Series, counter_rate, finished_value, leader_value, series
from tandem.watch.summary import SUMMARY_FILE, Result, WatchSummary, summarize

REPORT_FILE = "report.md"
_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int = 24) -> str:
    """The last ``width`` values as block characters, scaled to their own range."""
    tail = list(values)[-width:]
    known = [v for v in tail if v is not None]
    if not known:
        return ""
    low, high = min(known), max(known)
    span = (high - low) or 1.0
    return "".join(
        " " if v is None else _BLOCKS[min(7, int((v - low) / span * 7.999))] for v in tail
    )


def _num(value: float | None, fmt: str = ".1f", unit: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{unit}"


def _gib(size: int | None) -> float | None:
    """GiB for the panel, where 0 bytes reads as unknown too (``series.gib`` keeps a 0)."""
    return size / GIB if size else None


def _pct(fraction: float | None) -> float | None:
    return fraction * 100 if fraction is not None else None


_NODE_COLUMNS = (
    "node",
    "mem used",
    "available",
    "trend",
    "rank",
    "up",
    "RSS",
    "CPU",
    "GPU °C / MHz / W",
)
_LEADER_COLUMNS = (
    "running",
    "waiting",
    "KV cache",
    "prompt tok/s",
    "gen tok/s",
    "trend gen",
    "preemptions",
    "errors",
)


def live_view(run: WatchRun, window: Sequence[Sample]) -> Group:
    """The live terminal panel: verdict line, nodes and ranks, the leader's load, with trends."""
    window = list(window)
    latest = window[-1]
    columns = series(window)
    colour = latest.verdict.colour
    head = Text.assemble(
        (f"{run.name}  ", "bold"),
        (latest.verdict.value, colour),
        f"   sample {latest.seq}   {latest.time:%H:%M:%S} UTC"
        f"   restarts {latest.restarts}"
        f"   sample cost {latest.cost_s * 1000:.0f} ms",
    )
    nodes = Table(*_NODE_COLUMNS, box=None, pad_edge=False)
    for node in latest.nodes:
        gpus = (
            ", ".join(
                f"{_num(g.temperature_c, '.0f')}/{_num(g.sm_clock_mhz, '.0f')}/"
                f"{_num(g.power_w, '.0f')}{' [red]throttled[/]' if g.throttled else ''}"
                for g in node.gpus
            )
            or "–"
        )
        if node.error:
            nodes.add_row(node.node, f"[red]{node.error}[/]", "", "", "", "", "", "", "")
            continue
        # the node's own cells, on the row of its first rank only
        own = [
            node.node,
            f"{_num(_gib(node.mem_used_bytes), '.2f')} / {_num(_gib(node.mem_total_bytes))} GiB",
            _num(_gib(node.mem_available_bytes), ".2f", " GiB"),
            sparkline(columns.mem_used_gib.get(node.node, [])),
        ]
        for r in node.ranks or (None,):
            key = f"rank {r.rank} ({node.node})" if r else ""
            cpu = columns.rank_cpu_pct.get(key, [None])[-1] if r else None
            nodes.add_row(
                *own,
                str(r.rank) if r else "–",
                ("[green]up[/]" if r.up else "[bold red]down[/]") if r else "",
                _num(_gib(r.rss_bytes) if r else None, ".2f", " GiB"),
                _num(cpu, ".0f", " %"),
                gpus,
            )
            own, gpus = [""] * len(own), ""
    leader = Table(*_LEADER_COLUMNS, box=None, pad_edge=False)
    reading = latest.leader
    if reading is None:
        leader.add_row("[red]/metrics did not answer[/]", "", "", "", "", "", "", "")
    else:
        prev = window[-2] if len(window) > 1 else None
        errors = finished_value(ERROR_REASONS)(latest)
        leader.add_row(
            _num(reading.requests_running, ".0f"),
            _num(reading.requests_waiting, ".0f"),
            _num(_pct(reading.kv_cache_usage), ".1f", " %"),
            _num(counter_rate(prev, latest, leader_value("prompt_tokens")) if prev else None),
            _num(counter_rate(prev, latest, leader_value("generation_tokens")) if prev else None),
            sparkline(columns.generation_tok_s),
            _num(reading.preemptions, ".0f"),
            _num(errors, ".0f"),
        )
    return Group(head, nodes, leader)


_CHECK_FORMATS = {"fraction": ".3g", "GiB": ".2f", "°C": ".1f"}
"""How a check's observed value is written, by its unit (counts: whole numbers)."""


def markdown(summary: WatchSummary) -> str:
    """The Markdown summary: the checks with PASS/FAIL, then memory per node and the load."""
    lines = [f"# Watch of `{summary.name}`", ""]
    verdict = "PASS" if summary.passed else "FAIL"
    lines += [
        f"**{verdict}**: {sum(c.result is Result.PASS for c in summary.checks)} passed, "
        f"{sum(c.result is Result.FAIL for c in summary.checks)} failed, "
        f"{sum(c.result is Result.SKIP for c in summary.checks)} skipped.",
        "",
    ]
    span = (
        f"{summary.started:%Y-%m-%d %H:%M:%S} to {summary.ended:%H:%M:%S} UTC"
        if summary.started and summary.ended
        else "no sample"
    )
    lines += [
        f"{summary.samples} samples every {summary.interval_s:g} s, {span}, "
        f"{summary.covered_s / 60:.1f} min sampled in {summary.segments} segment(s).",
        "",
    ]
    skipped = JsonLines(damaged=summary.damaged_lines, torn=summary.torn_last_line).skipped_note
    if skipped:
        lines += [f"**samples.jsonl**: {skipped}; those samples are not judged.", ""]
    lines += ["| check | observed | threshold | result | detail |", "|---|---|---|---|---|"]
    for c in summary.checks:
        observed = _num(c.observed, _CHECK_FORMATS.get(c.unit, ".0f"))
        threshold = "–" if c.threshold is None else f"{c.threshold:g}"
        lines.append(
            f"| {c.name} | {observed} {c.unit} | {threshold} | **{c.result.value}** | {c.detail} |"
        )
    lines += [
        "",
        "## Memory per node (MemTotal − MemAvailable)",
        "",
        "| node | total GiB | min used | max used | drift | min available | OOM kills |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in summary.nodes:
        lines.append(
            f"| {m.node} | {_num(m.total_gib)} | {_num(m.min_used_gib, '.2f')} | "
            f"{_num(m.max_used_gib, '.2f')} | {_num(m.drift_gib, '+.2f')} | "
            f"{_num(m.min_available_gib, '.2f')} | {m.oom_kills} |"
        )
    lines += [
        "",
        "## Load and health",
        "",
        f"- requests finished: {summary.requests_finished} "
        f"({summary.request_errors} errors or aborts)",
        f"- generation tokens: {summary.generation_tokens}",
        f"- peak KV cache usage: {_num(_pct(summary.peak_kv_cache_usage))} %",
        f"- most requests waiting: {_num(summary.max_requests_waiting, '.0f')}",
        f"- preemptions: {summary.preemptions}",
        f"- GPUs: {summary.gpus}; peak temperature "
        f"{_num(summary.peak_temperature_c, '.0f', ' °C')}; throttle events "
        f"{summary.throttle_events}",
        f"- restarts: {summary.restarts}"
        + (
            " at " + ", ".join(f"{t:%H:%M:%S}" for t in summary.restart_times)
            if summary.restart_times
            else ""
        ),
        "- samples per verdict: " + ", ".join(f"{k} {v}" for k, v in summary.verdicts.items()),
        f"- mean sample cost: {_num((summary.mean_sample_cost_s or 0) * 1000, '.0f')} ms",
        "",
    ]
    return "\n".join(lines)


def report_folder(
    folder: Path, overrides: dict | None = None, *, plots: bool = True
) -> tuple[WatchSummary, list[Path]]:
    """Judge a watch folder: summary.json, report.md and the plots; returns the summary and
    the files written. ``overrides`` replace thresholds of the recipe's ``watch:`` section."""
    folder = Path(folder)
    run = read_run(folder)
    if run is None:
        raise SpecError(
            f"{folder} holds no watch (no watch.json)",
            field="RUN_DIR",
            hint="give the --out of a `tandem watch`",
        )
    read = read_samples(folder)
    samples = read.records
    summary = summarize(
        run,
        samples,
        run.thresholds.model_copy(update=overrides or {}),
        damaged_lines=read.damaged,
        torn_last_line=read.torn,
    )
    files.write_json(folder / SUMMARY_FILE, summary)
    files.write_text(folder / REPORT_FILE, markdown(summary))
    written = [folder / SUMMARY_FILE, folder / REPORT_FILE]
    return summary, written + (write_plots(samples, folder) if plots else [])


def write_plots(samples: list[Sample], out_dir: Path) -> list[Path]:
    """memory.png, gpu.png (where GPUs reported), tokens.png, load.png; returns those written."""
    if not samples:
        return []
    # matplotlib costs ~0.5 s of CPU to import; only the report pays it, never a sample.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = series(samples)
    times = cols.times
    written = []
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for node, values in cols.mem_used_gib.items():
        top.plot(times, _nan(values), label=node)
    top.set(ylabel="GiB", title="Host memory in use (MemTotal − MemAvailable)")
    for key, values in cols.rank_rss_gib.items():
        bottom.plot(times, _nan(values), label=key)
    bottom.set(ylabel="GiB", title="Rank RSS")
    written.append(_finish(fig, [top, bottom], cols, out_dir / "memory.png", plt))
    if cols.gpu_temperature_c:
        fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
        for (column, title, unit), ax in zip(
            (
                (cols.gpu_temperature_c, "GPU temperature", "°C"),
                (cols.gpu_sm_clock_mhz, "SM clock", "MHz"),
                (cols.gpu_power_w, "Power", "W"),
            ),
            axes,
        ):
            for key, values in column.items():
                ax.plot(times, _nan(values), label=key)
            ax.set(ylabel=unit, title=title)
        for key, flags in cols.gpu_throttled.items():
            hot = [
                (t, c)
                for t, f, c in zip(times, flags, cols.gpu_sm_clock_mhz[key])
                if f and c is not None
            ]
            if hot:
                axes[1].plot(*zip(*hot), "rv", label=f"{key} throttled")
        written.append(_finish(fig, list(axes), cols, out_dir / "gpu.png", plt))
    fig, ax = plt.subplots(figsize=(9, 4))
    # matplotlib plots datetimes through its unit registry; its stubs list only numbers
    ax.plot(times, _nan(cols.generation_tok_s), label="generation tok/s")  # type: ignore[arg-type]
    ax.plot(times, _nan(cols.prompt_tok_s), label="prompt tok/s")  # type: ignore[arg-type]
    ax.set(ylabel="tokens/s", title="Token throughput (leader's counters)")
    written.append(_finish(fig, [ax], cols, out_dir / "tokens.png", plt))
    fig, (kv, queue) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    kv.plot(times, _nan(cols.kv_cache_pct), label="KV cache usage")
    kv.set(ylabel="%", title="KV cache usage", ylim=(0, 105))
    queue.plot(times, _nan(cols.requests_running), label="running")
    queue.plot(times, _nan(cols.requests_waiting), label="waiting")
    queue.set(ylabel="requests", title="Requests running and waiting")
    written.append(_finish(fig, [kv, queue], cols, out_dir / "load.png", plt))
    return written


def _nan(values: Sequence[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def _finish(fig, axes, cols: Series, path: Path, plt) -> Path:
    for ax in axes:
        for i, t in enumerate(cols.restarts):
            ax.axvline(t, color="red", linewidth=1.2, label="restart" if i == 0 else None)
        _shade(ax, cols.times, cols.not_healthy)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time (UTC)")
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _shade(ax, times: list[datetime], flags: list[bool]) -> None:
    """Shade the runs of samples whose verdict was not healthy."""
    start = None
    for t, flag in zip([*times, None], [*flags, False]):
        if flag and start is None:
            start = t
        elif not flag and start is not None:
            ax.axvspan(start, t or times[-1], color="red", alpha=0.12, linewidth=0)
            start = None
