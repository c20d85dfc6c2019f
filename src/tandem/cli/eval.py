"""``tandem eval``: quality evaluation of an endpoint (GPQA-Diamond), and rescoring a saved log."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import click

from tandem import ownership
from tandem.backends.state import load_state
from tandem.cli.layout import SectionedCommand, WholeSummaryGroup
from tandem.cli.options import (
    api_key_option,
    field_option,
    force_option,
    json_object,
    model_option,
    url_option,
)
from tandem.endpoint import Endpoint, pick_model
from tandem.errors import SpecError
from tandem.eval import smoke
from tandem.eval.log import SamplingParams
from tandem.eval.report import EvalReport, render_markdown
from tandem.eval.runner import GPQAConfig, rescore_log, run_gpqa
from tandem.operations import evidence
from tandem.report.watch import report_folder
from tandem.watch.background import WATCH_DIR, BackgroundWatch

FALLBACK: SamplingParams = GPQAConfig.model_fields["fallback_sampling"].get_default(
    call_default_factory=True
)
"""The re-ask's sampling as GPQAConfig declares it: the defaults of the --fallback-* options."""


@click.group(
    "eval", cls=WholeSummaryGroup, context_settings={"help_option_names": ["-h", "--help"]}
)
def eval_command() -> None:
    """Evaluate answer quality against an OpenAI-compatible endpoint.

    \b
    Examples:
      tandem eval gpqa --csv gpqa_diamond.csv tiny-local --out runs/gpqa1
      tandem eval gpqa --csv gpqa_diamond.csv --url http://10.77.0.1:8000 --limit 20 --out runs/g2
      tandem eval gpqa --csv gpqa_diamond.csv tiny-local --out runs/gpqa1 --resume
      tandem eval rescore runs/gpqa1/responses.jsonl
    """


GPQA_SECTIONS = {
    "Target": ["url", "model", "api_key"],
    "Questions": ["csv_path", "limit", "repeats", "seed", "reference_accuracy"],
    "Sampling": ["temperature", "top_p", "max_tokens", "chat_template_kwargs"],
    "Re-ask without thinking": [
        "fallback",
        "fallback_max_tokens",
        "fallback_chat_template_kwargs",
        "fallback_context_chars",
    ],
    "Requests": ["concurrency", "request_timeout_s", "retry_budget_s"],
    "Output": ["out_dir", "resume", "force", "no_progress", "watch"],
}
"""``eval gpqa --help``'s headings."""


quiet_option = click.option(
    "--quiet", "-q", "--no-progress", "no_progress", is_flag=True, help="No live progress bar."
)
"""``-q/--quiet``, as ``bench run``'s (``--no-progress``, its first spelling, still works)."""


@eval_command.command("gpqa", cls=SectionedCommand, sections=GPQA_SECTIONS)
@click.argument("deployment", required=False)
@click.option(
    "--csv",
    "csv_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="GPQA CSV (official columns). The data set is gated: bring your own copy.",
)
@url_option
@model_option
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for responses.jsonl, report.json, report.md, report.html.",
)
@field_option(GPQAConfig, "limit")
@field_option(GPQAConfig, "repeats")
@field_option(GPQAConfig, "seed")
@field_option(SamplingParams, "temperature")
@field_option(SamplingParams, "top_p")
@field_option(SamplingParams, "max_tokens")
@field_option(SamplingParams, "chat_template_kwargs", callback=json_object)
@field_option(GPQAConfig, "concurrency")
@field_option(GPQAConfig, "fallback")
@field_option(
    SamplingParams,
    "max_tokens",
    flag="--fallback-max-tokens",
    param="fallback_max_tokens",
    default=FALLBACK.max_tokens,
    help="max_tokens of the re-ask.",
)
@field_option(
    SamplingParams,
    "chat_template_kwargs",
    flag="--fallback-chat-template-kwargs",
    param="fallback_chat_template_kwargs",
    default=FALLBACK.chat_template_kwargs,
    callback=json_object,
    help="Sent as chat_template_kwargs with the re-ask (thinking off).",
)
@field_option(GPQAConfig, "fallback_context_chars")
@field_option(GPQAConfig, "request_timeout_s", flag="--request-timeout")
@field_option(GPQAConfig, "retry_budget_s", flag="--retry-budget")
@click.option("--resume", is_flag=True, help="Continue the log in --out; skip finished samples.")
@field_option(GPQAConfig, "reference_accuracy", flag="--reference")
@quiet_option
@click.option(
    "--watch",
    "watch",
    is_flag=True,
    help="Record the DEPLOYMENT's telemetry (`tandem watch`) into OUT/watch while the "
    "eval runs, and judge it there (a soak under the eval's load).",
)
@force_option
@api_key_option
def gpqa_command(
    deployment: str | None,
    csv_path: str,
    url: str | None,
    model: str | None,
    out_dir: str,
    limit: int | None,
    repeats: int,
    seed: int,
    temperature: float,
    top_p: float | None,
    max_tokens: int,
    chat_template_kwargs: dict,
    concurrency: int,
    fallback: bool,
    fallback_max_tokens: int,
    fallback_chat_template_kwargs: dict,
    fallback_context_chars: int,
    request_timeout_s: float,
    retry_budget_s: float,
    resume: bool,
    reference_accuracy: float,
    no_progress: bool,
    watch: bool,
    force: bool,
    api_key: str | None,
) -> None:
    """Run GPQA-Diamond against a deployment or a URL.

    DeepSeek-V4-Flash-DSpark's published protocol: zero-shot simple-evals prompt ending in
    'ANSWER: $LETTER', thinking on, temperature 0, 32768 max tokens, concurrency 2; options
    shuffled by (record id, repeat, seed); a thinking-off re-ask for an answer it cannot parse.
    Each finished request is appended to OUT/responses.jsonl: --resume continues a cut run.

    \b
    Examples:
      tandem eval gpqa --csv gpqa_diamond.csv tiny-local --out runs/gpqa1
      tandem eval gpqa --csv gpqa_diamond.csv --url http://127.0.0.1:8000 --model tiny-deepseek \\
          --limit 5 --max-tokens 64 --out runs/smoke
      tandem eval gpqa --csv gpqa_diamond.csv tiny-local --out runs/soak --watch
    """
    if (deployment is None) == (url is None):
        raise SpecError(
            "give either a DEPLOYMENT name or --url, not both and not neither",
            field="DEPLOYMENT/--url",
            hint="e.g. `tandem eval gpqa --csv F tiny-local --out D`",
        )
    if deployment is not None:
        state = load_state(deployment)  # with replicas, through the router
        url, model = state.endpoint, model or state.model
    config = GPQAConfig(
        csv=Path(csv_path),
        url=url,
        model=model,
        api_key=api_key,
        out_dir=ownership.check_output_folder(Path(out_dir), force=force),
        limit=limit,
        repeats=repeats,
        seed=seed,
        sampling=SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            chat_template_kwargs=chat_template_kwargs,
        ),
        concurrency=concurrency,
        fallback=fallback,
        fallback_sampling=SamplingParams(
            temperature=temperature,
            max_tokens=fallback_max_tokens,
            chat_template_kwargs=fallback_chat_template_kwargs,
        ),
        fallback_context_chars=fallback_context_chars,
        request_timeout_s=request_timeout_s,
        retry_budget_s=retry_budget_s,
        resume=resume,
        reference_accuracy=reference_accuracy,
        progress=not no_progress,
    )
    if watch and deployment is None:
        raise SpecError("--watch needs a DEPLOYMENT name (its nodes), not --url", field="--watch")
    with BackgroundWatch(deployment, Path(out_dir) / WATCH_DIR) if watch else nullcontext():
        report = run_gpqa(config)
    _after_gpqa(report, Path(out_dir), deployment, watch=watch)


def _after_gpqa(report: EvalReport, out: Path, deployment: str | None, *, watch: bool) -> None:
    """The report, the run as evidence of the deployment's revision (``tandem dashboard``
    links it), and the verdict of the watch beside it."""
    _show(report, out)
    if deployment is not None:
        accuracy = f"{report.accuracy:.1%}" if report.accuracy is not None else "no answer"
        evidence.record(deployment, "eval", out, summary=f"GPQA {accuracy}", report="report.html")
    if watch:
        summary, _ = report_folder(out / WATCH_DIR)
        click.echo(
            f"watch: {'PASS' if summary.passed else 'FAIL'}, {out / WATCH_DIR / 'report.md'}"
        )


@eval_command.command("rescore")
@click.argument("log", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    help="Where to write the reports. Default: the log's folder.",
)
@force_option
def rescore_command(log: str, out_dir: str | None, force: bool) -> None:
    """Score a saved GPQA run again: answers re-extracted, reports rewritten.

    Reads the run's responses.jsonl; the server is not asked again.

    No request is sent: use it after the extraction rules change, or to inspect a run.

    \b
    Examples:
      tandem eval rescore runs/gpqa1/responses.jsonl
      tandem eval rescore runs/gpqa1/responses.jsonl --out runs/gpqa1-rescored
    """
    if out_dir:
        ownership.output_folder(Path(out_dir), force=force)
    report = rescore_log(log, out_dir)
    _show(report, Path(out_dir) if out_dir else Path(log).parent)


def _show(report: EvalReport, out_dir: Path) -> None:
    click.echo(render_markdown(report))
    click.echo(f"reports: {out_dir / 'report.json'}, report.md, report.html")


def _lengths(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        lengths = [int(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a comma-separated list of token counts"
        ) from None
    if any(n < 16 for n in lengths):
        raise click.BadParameter("each length must be at least 16 tokens")
    return lengths


@eval_command.command("smoke")
@click.argument("deployment", required=False)
@url_option
@model_option
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for smoke.jsonl (each check as it ends), smoke.json and smoke.md.",
)
@click.option(
    "--check",
    "checks",
    multiple=True,
    type=click.Choice(list(smoke.CHECKS)),
    help="Run only this check (repeatable). Default: all.",
)
@click.option(
    "--needle-lengths",
    callback=_lengths,
    help="Prompt lengths in tokens for the needle, e.g. 256,900. Default: a quarter, half and "
    "nearly all of the deployment's max_model_len.",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=64),
    help="With --url: the server's context length, for the needle.",
)
@click.option("--tool-call-parser", help="With --url: the server's --tool-call-parser.")
@click.option("--reasoning-parser", help="With --url: the server's --reasoning-parser.")
@click.option("--resume", is_flag=True, help="Keep the checks already in --out; run the rest.")
@force_option
@api_key_option
def smoke_command(
    deployment: str | None,
    url: str | None,
    model: str | None,
    out_dir: str,
    checks: tuple[str, ...],
    needle_lengths: list[int] | None,
    max_model_len: int | None,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    resume: bool,
    force: bool,
    api_key: str | None,
) -> None:
    """Check a deployment right after it boots: template, determinism, tools, context.

    The checks (chat template, greedy determinism, tool calls, a long-context needle, the
    reasoning split, speculative acceptance) are each a verdict with its evidence; one that
    cannot apply says why. Exit status 1 when any check fails.

    \b
    Examples:
      tandem eval smoke tiny-local --out runs/smoke1
      tandem eval smoke --url http://10.77.0.1:8000 --max-model-len 8192 --out runs/s2
      tandem eval smoke tiny-local --check determinism --out runs/s3
    """
    if (deployment is None) == (url is None):
        raise SpecError(
            "give either a DEPLOYMENT name or --url, not both and not neither",
            field="DEPLOYMENT/--url",
            hint="e.g. `tandem eval smoke tiny-local --out D`",
        )
    targets: dict[str, smoke.SmokeTarget] = {}
    if deployment is not None:
        groups = load_state(deployment).groups
        for group in groups:  # each group at its own leader (with replicas: OUT/gG/)
            where = f"g{group.group}" if len(groups) > 1 else ""
            targets[where] = smoke.target_of(group, model)
    else:
        assert url is not None
        with Endpoint(url, api_key=api_key) as endpoint:
            served = pick_model(endpoint.models(), model)
        targets[""] = smoke.SmokeTarget(
            url=url,
            model=served.id,
            max_model_len=max_model_len or served.max_model_len,
            tool_call_parser=tool_call_parser,
            auto_tool_choice=tool_call_parser is not None,
            reasoning_parser=reasoning_parser,
        )
    folder = ownership.output_folder(Path(out_dir), force=force)
    failed = False
    for where, target in targets.items():
        out = folder / where if where else folder
        report = smoke.run_smoke(
            target,
            out,
            api_key=api_key,
            checks=list(checks) or None,
            needle=needle_lengths,
            resume=resume,
            on_result=_said(f"group {where[1:]} " if where else ""),
        )
        failed = _smoke_done(report, out, deployment, where) or failed
    if failed:
        raise click.exceptions.Exit(1)


def _said(who: str):
    def said(result: smoke.CheckResult) -> None:
        click.echo(f"{who}{result.check:<12} {result.outcome.value:<15} {result.summary}")

    return said


def _smoke_done(report: smoke.SmokeReport, out: Path, deployment: str | None, where: str) -> bool:
    """Say a group's verdict and keep its run as evidence of the group's revision (``tandem
    dashboard`` links it); True when it failed."""
    who = f"group {where[1:]} " if where else ""
    click.echo(
        f"{who}{'PASS' if report.ok else 'FAIL'}: reports {out / smoke.REPORT_MD}, smoke.json"
    )
    if deployment is not None:
        evidence.record(
            deployment,
            "smoke",
            out,
            group=int(where[1:]) if where else None,
            summary=", ".join(f"{c.check} {c.outcome.value}" for c in report.checks),
            passed=report.ok,
            report=smoke.REPORT_MD,
        )
    return not report.ok
