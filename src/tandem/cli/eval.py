"""``tandem eval``: quality evaluation of an endpoint (GPQA-Diamond), and rescoring a saved log."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click

from tandem import ownership, screen
from tandem.backends.state import load_state
from tandem.cli.layout import HELP_OPTIONS, SectionedCommand, WholeSummaryGroup
from tandem.cli.options import (
    POSITIVE,
    api_key_option,
    field_option,
    force_option,
    json_object,
    model_option,
    option_of,
    out_option,
    stack,
    url_option,
)
from tandem.endpoint import MODELS_TIMEOUT_S, Endpoint, pick_model
from tandem.errors import SpecError
from tandem.eval import smoke
from tandem.eval.log import RUN as GPQA_RUN
from tandem.eval.log import SamplingParams
from tandem.eval.prompt_sets import reference_sets
from tandem.eval.reference import RUN as REFERENCE_RUN
from tandem.eval.reference import load_reference, record_at, save_reference
from tandem.eval.report import EvalReport, render_markdown
from tandem.eval.runner import RESCORE, GPQAConfig, gpqa_identity, rescore_log, run_gpqa
from tandem.operations import evidence
from tandem.report.watch import report_folder
from tandem.watch.background import WATCH_DIR, BackgroundWatch

FALLBACK: SamplingParams = GPQAConfig.model_fields["fallback_sampling"].get_default(
    call_default_factory=True
)
"""The re-ask's sampling as GPQAConfig declares it: the defaults of the --fallback-* options."""


@click.group("eval", cls=WholeSummaryGroup, context_settings=HELP_OPTIONS)
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


def _target_options(out_help: str) -> Callable[[Any], Any]:
    """DEPLOYMENT or ``--url`` (and ``--model``), and ``--out``: how every ``eval`` command
    that sends requests is told its server; ``out_help`` says what it writes there."""
    return stack(
        click.argument("deployment", required=False),
        url_option,
        model_option,
        out_option(out_help, required=True),
    )


quiet_option = click.option(
    "--quiet", "-q", "--no-progress", "no_progress", is_flag=True, help="No live progress bar."
)
"""``-q/--quiet``, as ``bench run``'s (``--no-progress``, its first spelling, still works)."""


@eval_command.command("gpqa", cls=SectionedCommand, sections=GPQA_SECTIONS)
@click.option(
    "--csv",
    "csv_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="GPQA CSV (official columns). The data set is gated: bring your own copy.",
)
@_target_options("Folder for responses.jsonl, report.json, report.md, report.html.")
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
    temperature: float,
    top_p: float | None,
    max_tokens: int,
    chat_template_kwargs: dict,
    fallback_max_tokens: int,
    fallback_chat_template_kwargs: dict,
    no_progress: bool,
    watch: bool,
    force: bool,
    api_key: str | None,
    **fields: Any,
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
    _deployment_or_url(deployment, url, "`tandem eval gpqa --csv F tiny-local --out D`")
    if deployment is not None:
        state = load_state(deployment)  # with replicas, through the router
        url, model = state.endpoint, model or state.model
    config = GPQAConfig(
        csv=Path(csv_path),
        url=url,
        model=model,
        api_key=api_key,
        out_dir=Path(out_dir),
        sampling=SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            chat_template_kwargs=chat_template_kwargs,
        ),
        fallback_sampling=SamplingParams(
            temperature=temperature,
            max_tokens=fallback_max_tokens,
            chat_template_kwargs=fallback_chat_template_kwargs,
        ),
        progress=not no_progress,
        **fields,  # every other option sets the GPQAConfig field of its name
    )
    if watch and deployment is None:
        raise SpecError("--watch needs a DEPLOYMENT name (its nodes), not --url", field="--watch")
    claim = ownership.claim_output(
        config.out_dir,
        GPQA_RUN,
        gpqa_identity(config),
        resume=config.resume,
        force=force,
        flag_of=lambda name: option_of(GPQAConfig, name),
    )
    with BackgroundWatch(deployment, config.out_dir / WATCH_DIR) if watch else nullcontext():
        report = run_gpqa(config, claim=claim)
    _after_gpqa(report, config.out_dir, deployment, watch=watch)


def _after_gpqa(report: EvalReport, out: Path, deployment: str | None, *, watch: bool) -> None:
    """The report, the run as evidence of the deployment's revision (``tandem dashboard``
    links it), and the verdict of the watch beside it."""
    _show(report, out)
    if deployment is not None:
        accuracy = f"{report.accuracy:.1%}" if report.accuracy is not None else "no answer"
        evidence.record(deployment, "eval", out, summary=f"GPQA {accuracy}", report="report.html")
    if watch:
        summary, _ = report_folder(out / WATCH_DIR)
        screen.echo(
            f"watch: {'PASS' if summary.passed else 'FAIL'}, {out / WATCH_DIR / 'report.md'}"
        )


@eval_command.command("rescore")
@click.argument("log", type=click.Path(dir_okay=False))
@out_option("Where to write the reports. Default: the log's folder.")
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
        ownership.claim_output(
            Path(out_dir), RESCORE, {"log": str(Path(log).resolve())}, force=force
        ).make()
    report = rescore_log(log, out_dir)
    _show(report, Path(out_dir) if out_dir else Path(log).parent)


def _show(report: EvalReport, out_dir: Path) -> None:
    screen.echo(render_markdown(report))
    screen.echo(f"reports: {out_dir / 'report.json'}, report.md, report.html")


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


SMOKE_SECTIONS = {
    "Target": ["url", "model", "api_key"],
    "Checks": ["checks", "needle_lengths", "reference_path", "request_timeout_s"],
    "A --url server's flags": ["max_model_len", "tool_call_parser", "reasoning_parser"],
    "Output": ["out_dir", "resume", "force"],
}
SERVER_FLAGS = SMOKE_SECTIONS["A --url server's flags"]
"""What ``eval smoke`` must be told of a ``--url`` server (a deployment's record knows)."""


@eval_command.command("smoke", cls=SectionedCommand, sections=SMOKE_SECTIONS)
@_target_options("Folder for smoke.jsonl (each check as it ends), smoke.json and smoke.md.")
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
@click.option(
    "--request-timeout",
    "request_timeout_s",
    type=POSITIVE,
    default=smoke.REQUEST_TIMEOUT_S,
    show_default=True,
    help="Seconds one request may take before its check fails (a needle prompt of a long "
    "context needs minutes on a real engine; a server that hangs is found sooner with less).",
)
@click.option(
    "--reference",
    "reference_path",
    type=click.Path(exists=True),
    help="A good revision's answers (`tandem eval reference --out`, a file or its folder): the "
    "answers check judges the server against them. Without it, the known-answer set alone.",
)
@click.option("--resume", is_flag=True, help="Keep the checks already in --out; run the rest.")
@force_option
@api_key_option
def smoke_command(
    deployment: str | None,
    url: str | None,
    model: str | None,
    out_dir: str,
    force: bool,
    api_key: str | None,
    **options: Any,
) -> None:
    """Check a deployment right after it boots: template, determinism, tools, context, answers.

    Each check (chat template, greedy determinism, tool calls, a long-context needle, the
    reasoning split, speculative acceptance, answers against a --reference) is a verdict with
    its evidence; one that cannot apply says why. Exit status 1 when any check fails.

    \b
    Examples:
      tandem eval smoke tiny-local --out runs/smoke1
      tandem eval smoke --url http://10.77.0.1:8000 --max-model-len 8192 --out runs/s2
      tandem eval smoke smollm2-local --check answers --reference runs/ref1 --out runs/s4
    """
    server = {flag: options.pop(flag) for flag in SERVER_FLAGS}
    run = _smoke_run(**options)
    targets = _smoke_targets(deployment, url, model, api_key, run, **server)
    first = next(iter(targets.values()))  # a folder holds the runs of one deployment or URL
    folder = ownership.claim_output(
        Path(out_dir),
        smoke.RUN,
        first.model_dump(mode="json", include={"url", "model"}),
        resume=run.resume,
        force=force,
        flag_of=lambda name: f"--{name}",
    ).make()
    failed = False
    for where, target in targets.items():
        out = folder / where if where else folder
        report = smoke.run_smoke(
            target,
            out,
            run,
            api_key=api_key,
            on_result=_said(f"group {where[1:]} " if where else ""),
            on_progress=lambda text: screen.echo(text, err=True),
        )
        failed = _smoke_done(report, out, deployment, where) or failed
    if failed:
        raise click.exceptions.Exit(1)


def _smoke_run(
    checks: tuple[str, ...],
    needle_lengths: list[int] | None,
    request_timeout_s: float,
    reference_path: str | None,
    resume: bool,
) -> smoke.SmokeRun:
    """``eval smoke``'s options as the run they ask for (the reference read once, here)."""
    return smoke.SmokeRun(
        checks=list(checks) or None,
        needle=needle_lengths,
        resume=resume,
        timeout_s=request_timeout_s,
        reference=load_reference(Path(reference_path)) if reference_path else None,
    )


def _smoke_targets(
    deployment: str | None,
    url: str | None,
    model: str | None,
    api_key: str | None,
    run: smoke.SmokeRun,
    **server: Any,
) -> dict[str, smoke.SmokeTarget]:
    """What ``eval smoke`` judges: each group of a deployment at its own leader (``gG`` with
    replicas), or the server at ``url`` described by ``server`` (``max_model_len``,
    ``tool_call_parser``, ``reasoning_parser``).

    Raises:
        SpecError: a deployment and a URL, or neither.
        EndpointError: the URL lists no model.
    """
    _deployment_or_url(deployment, url, "`tandem eval smoke tiny-local --out D`")
    if deployment is not None:
        groups = load_state(deployment).groups
        return {f"g{g.group}" if len(groups) > 1 else "": smoke.target_of(g, model) for g in groups}
    assert url is not None
    with Endpoint(url, api_key=api_key) as endpoint:
        listed = endpoint.models(timeout_s=min(run.timeout_s, MODELS_TIMEOUT_S))
        served = pick_model(listed, model)
    return {
        "": smoke.SmokeTarget(
            url=url,
            model=served.id,
            max_model_len=server["max_model_len"] or served.max_model_len,
            tool_call_parser=server["tool_call_parser"],
            auto_tool_choice=server["tool_call_parser"] is not None,
            reasoning_parser=server["reasoning_parser"],
        )
    }


def _deployment_or_url(deployment: str | None, url: str | None, example: str) -> None:
    """A DEPLOYMENT name or ``--url``, exactly one.

    Raises:
        SpecError: both, or neither.
    """
    if (deployment is None) == (url is None):
        raise SpecError(
            "give either a DEPLOYMENT name or --url, not both and not neither",
            field="DEPLOYMENT/--url",
            hint=f"e.g. {example}",
        )


def _said(who: str):
    def said(result: smoke.CheckResult) -> None:
        screen.echo(f"{who}{result.check:<12} {result.outcome.value:<15} {result.summary}")

    return said


def _smoke_done(report: smoke.SmokeReport, out: Path, deployment: str | None, where: str) -> bool:
    """Say a group's verdict and keep its run as evidence of the group's revision (``tandem
    dashboard`` links it); True when it failed."""
    who = f"group {where[1:]} " if where else ""
    screen.echo(
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


@eval_command.command("reference")
@_target_options("Folder for answers-reference.json (what `eval smoke --reference` takes).")
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(exists=True, dir_okay=False),
    help='Your own prompts, asked besides the shipped sets: JSON Lines, {"prompt": "..."} or '
    '{"messages": [...]} a line, with optional "id", "max_tokens" and "answers".',
)
@force_option
@api_key_option
def reference_command(
    deployment: str | None,
    url: str | None,
    model: str | None,
    out_dir: str,
    prompts_file: str | None,
    force: bool,
    api_key: str | None,
) -> None:
    """Record a good revision's answers: the reference the answers check judges others by.

    The greedy answers to tandem's shipped prompt and known-answer sets (and --prompts), with
    their token ids and log-probabilities, and the noise the server showed scoring them again
    and one at a time. Takes a minute or two on a small model (every answer is generated twice).

    \b
    Examples:
      tandem eval reference smollm2-local --out runs/ref1
      tandem eval reference --url http://10.77.0.1:8000 --prompts mine.jsonl --out runs/ref2
      tandem eval smoke smollm2-local --check answers --reference runs/ref1 --out runs/s1
    """
    run = smoke.SmokeRun()
    targets = _smoke_targets(deployment, url, model, api_key, run, **dict.fromkeys(SERVER_FLAGS))
    target = next(iter(targets.values()))  # the groups of a deployment run one revision
    sets = reference_sets(Path(prompts_file) if prompts_file else None)
    out = ownership.claim_output(
        Path(out_dir),
        REFERENCE_RUN,
        target.model_dump(mode="json", include={"url", "model"}),
        force=force,
    ).make()
    reference = record_at(target.url, target.model, api_key, sets)
    written = save_reference(reference, out)
    judged = "" if reference.judgeable else " (its answers are near ties: it cannot judge)"
    screen.echo(
        f"recorded {len(reference.answers)} answers of {reference.model} in "
        f"{reference.seconds:.0f} s{judged}: {written}"
    )
