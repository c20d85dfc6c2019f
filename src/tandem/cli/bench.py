"""``tandem bench``: serving performance of an OpenAI-compatible endpoint; compare two runs.

``tandem bench [DEPLOYMENT] [options]`` is ``tandem bench run``: the group routes anything that
is not one of its subcommands to ``run``, so the short form and the noun-verb form both work.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from tandem import files, ownership, screen
from tandem.backends.state import load_state
from tandem.bench.compare import compare, load_summary
from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import (
    REQUESTS_FILE,
    BenchResult,
    ProgressEvent,
    read_records,
    run,
)
from tandem.bench.load_generator import RUN as BENCH_RUN
from tandem.bench.metrics import Slo
from tandem.bench.slo_search import RUN as SLO_RUN
from tandem.bench.slo_search import (
    SloSearch,
    check_objectives,
    search_conflicts,
    search_identity,
    slo_search,
)
from tandem.cli.layout import HELP_OPTIONS, RunByDefault, SectionedCommand
from tandem.cli.options import (
    POSITIVE,
    FloatIn,
    api_key_option,
    field_option,
    force_option,
    given,
    json_object,
    model_option,
    option_of,
    out_option,
)
from tandem.errors import CheckFailed, Problem, SpecError
from tandem.operations import evidence
from tandem.plan.status import planned_roofline_tok_s
from tandem.report.bench import (
    REPORT_FILE,
    SLO_REPORT_FILE,
    comparison_markdown,
    comparison_table,
    depth_table,
    markdown,
    rounds_table,
    settings_warning,
    slo_markdown,
    slo_table,
    slo_verdict,
    summary_table,
    verdict_text,
    write_plots,
)
from tandem.report.bench_html import CSV_FILE, HTML_FILE, html_report, points_csv
from tandem.report.terminal import show
from tandem.report.watch import report_folder
from tandem.watch.background import WATCH_DIR, BackgroundWatch


@click.group("bench", cls=RunByDefault, context_settings=HELP_OPTIONS)
def bench_command() -> None:
    """Measure serving performance of an OpenAI-compatible endpoint.

    Streams requests at each load point (a concurrency ladder, a request-rate ladder, a
    long-context prefill case) and records TTFT, TPOT, ITL and E2EL per request, with tokens
    from the server's usage and the server's own /metrics counters differenced per point: its
    token counts, prefix cache hit rate and its own mean TTFT, queue and prefill time over the
    point's requests, so the report says how much of the TTFT the HTTP path and the client add.
    Prompts are synthetic (optionally behind prefixes shared by groups of requests, behind a
    context of each depth of a `--depths` sweep (llama-benchy's pp and tg per depth), or as
    multi-turn chats) or rows of a prompt file; `--rounds` repeats the ladder for confidence
    intervals, and `compare` says whether a difference is beyond their noise. `--search-slo`
    finds the largest concurrency within percentile TTFT and TPOT objectives.
    `tandem bench ...` without a subcommand is `tandem bench run ...`; `tandem bench run
    --help` lists its options, under headings.

    \b
    Examples:
      tandem bench tiny-local --concurrency 1,2,4 --out runs/b1
      tandem bench --url http://10.77.0.1:8000 --model tiny-deepseek --concurrency 1,2,4 --out b1
      tandem bench --url http://127.0.0.1:8000 --rates 1,2,4 --max-concurrency 8 --out runs/r1
      tandem bench tiny-local --prefix-tokens 512 --prefix-groups 4 --concurrency 4 --out runs/p1
      tandem bench tiny-local --turns 4 --concurrency 2 --out runs/chat1
      tandem bench tiny-local --depths 0,256,512 --input-tokens 128 --output-tokens 32 --out d1
      tandem bench tiny-local --search-slo --slo-ttft-ms 2000 --slo-tpot-ms 100 --out runs/s1
      tandem bench tiny-local --prompt-file sharegpt.json --requests 200 --out runs/d1
      tandem bench tiny-local --concurrency 1,4 --rounds 5 --out runs/b1
      tandem bench compare runs/b1 runs/b2
      tandem bench report runs/b1
    """


def _ladder(number: Callable[[str], float], what: str) -> Callable[..., list]:
    """Click callback of a ladder option (``--concurrency 1,2,4``), its values ``number`` s."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> list:
        try:
            return [number(v) for v in (value or "").split(",") if v.strip()]
        except ValueError as exc:
            raise click.BadParameter(f"a comma-separated list of {what}") from exc

    return parse


_integers = _ladder(int, "integers, e.g. 1,2,4")
_numbers = _ladder(float, "numbers, e.g. 0.5,1,2")


bench_url_option = click.option(
    "--url",
    metavar="URL",
    envvar="TANDEM_BENCH_URL",
    show_envvar=True,
    help="Server root (no /v1), instead of a DEPLOYMENT name.",
)
"""``bench run --url``: an endpoint by its address, with the variable scripts set."""

SEARCH_FIELDS = ["percentile", "ceiling", "tolerance"]
"""``bench run``'s options that set the ``SloSearch`` field of their name (``--slo-percentile``)."""
RUN_SECTIONS = {
    "Target": ["url", "model", "endpoint", "api_key"],
    "Load": [
        "concurrency",
        "rates_rps",
        "burstiness",
        "max_concurrency",
        "requests",
        "rounds",
        "warmup_requests",
        "request_timeout_s",
        "seed",
    ],
    "Workload": [
        "input_tokens",
        "output_tokens",
        "prompt_token_ids",
        "ignore_eos",
        "temperature",
        "prompt_file",
        "prompt_column",
        "prefix_tokens",
        "prefix_groups",
        "turns",
        "depths",
        "long_context",
        "extra_body",
    ],
    "SLO and the SLO search": [
        "slo_ttft_ms",
        "slo_tpot_ms",
        "slo_e2el_ms",
        "search_slo",
        *SEARCH_FIELDS,
    ],
    "Server metrics": ["scrape_metrics", "kv_sample_interval_s", "roofline_decode_tok_s", "watch"],
    "Output": ["out_dir", "resume", "force", "plots", "quiet"],
}
"""``bench run --help``'s headings: its 42 options by what they set."""


@bench_command.command("run", cls=SectionedCommand, sections=RUN_SECTIONS)
@click.argument("deployment", required=False)
@bench_url_option
@model_option
@out_option(
    "Folder for requests.jsonl, summary.json, report.md, report.html, points.csv and plots."
)
@field_option(BenchConfig, "endpoint")
@field_option(BenchConfig, "concurrency", callback=_integers)
@field_option(BenchConfig, "rates_rps", flag="--rates", callback=_numbers)
@field_option(BenchConfig, "burstiness", type=FloatIn(min=0, min_open=True, infinite=True))
@field_option(BenchConfig, "max_concurrency")
@field_option(BenchConfig, "requests")
@field_option(BenchConfig, "input_tokens")
@field_option(BenchConfig, "prompt_token_ids", flag="--token-ids")
@field_option(BenchConfig, "output_tokens")
@field_option(BenchConfig, "ignore_eos")
@field_option(BenchConfig, "temperature")
@field_option(BenchConfig, "prompt_file", type=click.Path(dir_okay=False, exists=True))
@field_option(BenchConfig, "prompt_column")
@field_option(BenchConfig, "prefix_tokens")
@field_option(BenchConfig, "prefix_groups")
@field_option(BenchConfig, "turns")
@field_option(BenchConfig, "depths", callback=_integers)
@field_option(BenchConfig, "rounds")
@field_option(BenchConfig, "long_context")
@field_option(BenchConfig, "warmup_requests", flag="--warmup")
@field_option(BenchConfig, "request_timeout_s", flag="--timeout")
@click.option("--slo-ttft-ms", type=POSITIVE, help="Goodput SLO: maximum TTFT.")
@click.option("--slo-tpot-ms", type=POSITIVE, help="Goodput SLO: maximum TPOT.")
@click.option("--slo-e2el-ms", type=POSITIVE, help="Goodput SLO: maximum E2EL.")
@click.option(
    "--search-slo",
    is_flag=True,
    help="Instead of the ladder, find the largest concurrency at which the TTFT and TPOT at "
    "--slo-percentile stay within --slo-ttft-ms and --slo-tpot-ms (doubling, then bisecting; "
    "each probe saved in OUT/cN, resumable).",
)
@field_option(SloSearch, "percentile", flag="--slo-percentile")
@field_option(SloSearch, "ceiling", flag="--search-ceiling")
@field_option(SloSearch, "tolerance", flag="--search-tolerance")
@field_option(BenchConfig, "seed")
@field_option(BenchConfig, "scrape_metrics", flag="--server-metrics")
@field_option(BenchConfig, "kv_sample_interval_s", flag="--kv-sample-interval")
@field_option(
    BenchConfig,
    "roofline_decode_tok_s",
    flag="--roofline-tok-s",
    help="Single-stream decode roofline to compare with, tok/s; decode speed is reported "
    "as a fraction of it. Default for a DEPLOYMENT: its plan's (`tandem plan`).",
)
@field_option(BenchConfig, "extra_body", callback=json_object)
@click.option("--plots/--no-plots", default=True, show_default=True, help="Write PNG plots.")
@click.option("--quiet", "-q", is_flag=True, help="No live progress.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run in --out: keep its finished load points, redo the one it "
    "was stopped in. Same options as the first command.",
)
@click.option(
    "--watch",
    "watch",
    is_flag=True,
    help="Record the DEPLOYMENT's telemetry (`tandem watch`) into OUT/watch for the "
    "run's duration, and judge it there.",
)
@force_option
@api_key_option
def run_command(
    deployment: str | None,
    url: str | None,
    model: str | None,
    out_dir: str | None,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    slo_e2el_ms: float | None,
    search_slo: bool,
    plots: bool,
    quiet: bool,
    resume: bool,
    watch: bool,
    force: bool,
    api_key: str | None,
    **fields: Any,
) -> None:
    """Run a benchmark: each load point in turn, each request saved as it ends.

    \b
    Examples:
      tandem bench run tiny-local --concurrency 1,2,4 --out runs/b1
      tandem bench run tiny-local --concurrency 1,2,4 --out runs/b1 --resume   # after a kill
      tandem bench run --url http://127.0.0.1:8000 --endpoint completions --rates 2,4 --out r1
      tandem bench run tiny-local --concurrency 4 --requests 200 --out runs/soak --watch
    """
    if deployment and url:
        raise SpecError("give a DEPLOYMENT or --url, not both", field="url")
    url_given = url is not None
    if not url:
        state = load_state(deployment)  # with replicas, through the router to every group
        deployment = state.name  # the only one there is, when none was named
        url, model = state.endpoint, model or state.model
        if fields["roofline_decode_tok_s"] is None and len(state.groups) == 1:  # it has a plan
            group = state.groups[0]
            fields["roofline_decode_tok_s"] = planned_roofline_tok_s(group.recipe, group.cluster)
    search = {name: fields.pop(name) for name in SEARCH_FIELDS}  # the rest are BenchConfig's
    slo = Slo(
        ttft_s=_seconds(slo_ttft_ms), tpot_s=_seconds(slo_tpot_ms), e2el_s=_seconds(slo_e2el_ms)
    )
    try:
        config = BenchConfig(url=url, model=model, api_key=api_key, slo=slo, **fields)
    except ValidationError as exc:
        raise SpecError(
            "invalid bench options",
            problems=[
                Problem(option_of(BenchConfig, ".".join(str(p) for p in e["loc"])), e["msg"])
                for e in exc.errors()
            ],
        ) from exc
    _refuse(config.conflicts(), "would be ignored or overridden")
    if not config.concurrency and not config.rates_rps and not config.long_context:
        raise SpecError(
            "nothing to measure",
            field="concurrency",
            hint="give --concurrency, --rates or --long-context",
        )
    console = screen.console(stderr=True)
    if resume and out_dir is None:
        raise SpecError("--resume needs the --out of the run to continue", field="--resume")
    if watch and (out_dir is None or not deployment):
        raise SpecError(
            "--watch needs a DEPLOYMENT (its nodes) and --out (where the telemetry goes)",
            field="--watch",
        )
    if search_slo:
        wanted = SloSearch(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, **search)
        _search(config, wanted, out_dir, set(given(click.get_current_context(), fields)),
                resume=resume, force=force)  # fmt: skip
        return
    out: Path | None = None
    if out_dir is not None:
        out = _claimed(out_dir, BENCH_RUN, config.model_dump(mode="json"), resume, force)
    with BackgroundWatch(deployment, out / WATCH_DIR) if watch and out else nullcontext():
        if quiet:
            result = run(config, out, resume=resume)
        else:
            with _LiveProgress(console) as progress:
                result = run(config, out, progress.show, resume=resume)
    _show_tables(result)
    for warning in result.warnings + [w for p in result.points for w in p.warnings]:
        console.print(f"[yellow]warning:[/] {warning}")
    if out is not None:
        _write_run(result, out, plots=plots, watch=watch, named=None if url_given else deployment)


def _write_run(
    result: BenchResult, out: Path, *, plots: bool, watch: bool, named: str | None
) -> None:
    """The reports of a run with --out (and its watch's); a run of a deployment tandem runs is
    evidence of its revision (``tandem.operations.evidence``, shown by ``tandem dashboard``)."""
    written = write_reports(result, out, plots=plots)
    if watch:
        written += report_folder(out / WATCH_DIR, plots=plots)[1]
    screen.console(stderr=True).print(
        f"wrote {out / REQUESTS_FILE}, {out / 'summary.json'}, "
        + ", ".join(str(p) for p in written)
    )
    if named:
        evidence.record(named, "bench", out, summary=_headline(result), report=HTML_FILE)


def _headline(result: BenchResult) -> str:
    """One line for the status page: each point's output tok/s and failures."""
    return "; ".join(
        f"{p.point.label}: "
        + (
            f"{p.metrics.output_throughput_tok_s:.1f} tok/s"
            if p.metrics.output_throughput_tok_s is not None
            else "no output"
        )
        + (f", {p.metrics.failed} failed" if p.metrics.failed else "")
        for p in result.points
    )


def _search(
    config: BenchConfig,
    wanted: SloSearch,
    out_dir: str | None,
    given_fields: set[str],
    *,
    resume: bool,
    force: bool,
) -> None:
    """``--search-slo``: its options checked, its folder claimed, the search run and shown."""
    if out_dir is None:
        raise SpecError("--search-slo needs --out (each probe is saved there)", field="--out")
    _refuse(search_conflicts(config, given_fields), "that --search-slo would drop")
    check_objectives(wanted)
    folder = _claimed(out_dir, SLO_RUN, search_identity(config, wanted), resume, force)
    console = screen.console(stderr=True)
    search = slo_search(
        config,
        folder,
        wanted,
        resume=resume,
        on_probe=lambda p: console.print(
            f"concurrency {p.concurrency}: {'held' if p.passed else 'did not hold'}"
        ),
    )
    show(slo_table(search))
    files.write_text(folder / SLO_REPORT_FILE, slo_markdown(search))
    console.print(f"{slo_verdict(search)}\nwrote {folder / SLO_REPORT_FILE}")


def _refuse(problems: list[Problem], why: str) -> None:
    """Stop (SpecError) on clashing options, each named by its flag as typed, not its field."""
    if problems:
        raise SpecError(
            f"{len(problems)} bench option(s) {why}",
            problems=[replace(p, field=option_of(BenchConfig, p.field)) for p in problems],
        )


def _claimed(
    out_dir: str, kind: ownership.RunKind, run: dict[str, Any], resume: bool, force: bool
) -> Path:
    """``--out`` claimed for the run ``run`` of ``kind`` (``tandem.ownership``) and created."""
    return ownership.claim_output(
        Path(out_dir), kind, run, resume=resume, force=force, flag_of=_flag_of
    ).make()


def _flag_of(name: str) -> str:
    """The option of a part of a run's identity, for a message: a ``BenchConfig`` field's, or
    the name as an option (``search_identity`` names the search's parts by their options)."""
    if name in BenchConfig.model_fields:
        return option_of(BenchConfig, name)
    return "--" + name.replace("_", "-")


def _seconds(ms: float | None) -> float | None:
    return ms / 1000 if ms is not None else None


class _LiveProgress(Progress):
    """Rich progress: one bar per load point, with tokens/s and errors."""

    def __init__(self, console: Console) -> None:
        super().__init__(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.bars: dict[str, TaskID] = {}

    def show(self, event: ProgressEvent) -> None:
        if event.point is None:
            return
        point = event.point
        key = f"{event.phase}:{point.label}:{point.round}"
        if key not in self.bars:
            name = f"[{event.point_index + 1}/{event.points}] {point.label}"
            if point.round > 1:
                name += f" #{point.round}"
            if event.phase == "warmup":
                name = "warm-up"
            self.bars[key] = self.add_task(name, total=event.total or None, rate="")
        errors = f", [red]{event.errors} errors[/]" if event.errors else ""
        self.update(
            self.bars[key],
            completed=event.done,
            total=event.total or None,
            rate=f"{event.output_tok_s:7.1f} tok/s{errors}",
        )


@bench_command.command("compare")
@click.argument("a", type=click.Path(exists=True))
@click.argument("b", type=click.Path(exists=True))
@click.option("--markdown", "as_markdown", is_flag=True, help="Print Markdown instead.")
@click.option(
    "--confidence",
    type=FloatIn(min=0.5, max=1, max_open=True),
    default=0.95,
    show_default=True,
    help="Level of the intervals that tell a difference from the rounds' noise.",
)
@click.option(
    "--fail-if-worse",
    is_flag=True,
    help="Exit 1 when B is worse than A beyond the noise in any figure (an upgrade gate).",
)
def compare_command(
    a: str, b: str, as_markdown: bool, confidence: float, fail_if_worse: bool
) -> None:
    """Compare two runs: B against A, per load point.

    A and B are run folders or their summary.json files.

    With several rounds a side (`tandem bench --rounds`), each figure is the median over the
    rounds, and the noise column gives the exact distribution-free interval of the shift B − A
    (Hodges–Lehmann with Mann–Whitney's distribution): "beyond" when it leaves out 0. Four
    rounds a side are the fewest that can show a difference at 95 %.

    \b
    Examples:
      tandem bench compare runs/b1 runs/b2
      tandem bench compare runs/b1/summary.json runs/b2/summary.json --markdown > diff.md
      tandem bench compare runs/base runs/new --fail-if-worse   # exit 1 on a regression
    """
    comparison = compare(load_summary(a), load_summary(b), a, b, confidence=confidence)
    if comparison.settings_differ:
        screen.echo(f"warning: {settings_warning(comparison)}", err=True)
    if as_markdown:
        screen.echo(comparison_markdown(comparison), nl=False)
    else:
        show(comparison_table(comparison))
        if comparison.only_in_a or comparison.only_in_b:
            screen.echo(
                f"only in A: {', '.join(comparison.only_in_a) or 'none'}; "
                f"only in B: {', '.join(comparison.only_in_b) or 'none'}"
            )
        screen.echo(f"verdict: {verdict_text(comparison)}")
    worse = comparison.verdict().worse
    if fail_if_worse and worse:
        raise CheckFailed(
            f"B is worse than A beyond the noise in {len(worse)} figure(s): "
            + ", ".join(f"{r.label} {r.figure.name}" for r in worse)
        )


@bench_command.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--plots/--no-plots", default=True, show_default=True)
def report_command(run_dir: str, plots: bool) -> None:
    """Write a run's reports again from its saved files.

    report.md, report.html, points.csv and, with --plots, the PNG plots.

    \b
    Examples:
      tandem bench report runs/b1
      tandem bench report runs/b1 --no-plots
    """
    out = Path(run_dir)
    result = load_summary(out)
    _show_tables(result)
    write_reports(result, out, plots=plots)


def _show_tables(result: BenchResult) -> None:
    """A run on the terminal, after it ends or from its files: the summary, and the depth and
    rounds tables where the run has them."""
    show(summary_table(result))
    for table in (depth_table(result), rounds_table(result)):
        if table is not None:
            show(table)


def write_reports(result: BenchResult, out: Path, *, plots: bool) -> list[Path]:
    """report.md, the plots (from requests.jsonl, where it is), report.html with them inside,
    and points.csv, into ``out``; the files written."""
    files.write_text(out / REPORT_FILE, markdown(result))
    drawn: list[Path] = []
    if plots and (out / REQUESTS_FILE).exists():
        read = read_records(out / REQUESTS_FILE)
        if read.damaged:
            screen.echo(f"warning: {out / REQUESTS_FILE}: {read.skipped_note}", err=True)
        drawn = write_plots(result, read.records, out)
    files.write_text(out / HTML_FILE, html_report(result, drawn))
    files.write_text(out / CSV_FILE, points_csv(result))
    return [out / REPORT_FILE, out / HTML_FILE, out / CSV_FILE, *drawn]
