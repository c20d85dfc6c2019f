"""``tandem eval``: quality evaluation of an endpoint (GPQA-Diamond), and rescoring a saved log."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import click

from tandem import ownership
from tandem.backends.state import load_state
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
from tandem.eval.answer_client import AnswerClient
from tandem.eval.log import SamplingParams
from tandem.eval.prompt_sets import reference_sets
from tandem.eval.reference import load_reference, record_reference, save_reference
from tandem.eval.report import EvalReport, render_markdown
from tandem.eval.runner import GPQAConfig, rescore_log, run_gpqa
from tandem.operations.fleet import front_door
from tandem.report.watch import report_folder
from tandem.watch.background import WATCH_DIR, BackgroundWatch

FALLBACK: SamplingParams = GPQAConfig.model_fields["fallback_sampling"].get_default(
    call_default_factory=True
)
"""The re-ask's sampling as GPQAConfig declares it: the defaults of the --fallback-* options."""


@click.group("eval", context_settings={"help_option_names": ["-h", "--help"]})
def eval_command() -> None:
    """Evaluate answer quality against an OpenAI-compatible endpoint.

    \b
    Examples:
      tandem eval gpqa --csv gpqa_diamond.csv tiny-local --out runs/gpqa1
      tandem eval gpqa --csv gpqa_diamond.csv --url http://10.77.0.1:8000 --limit 20 --out runs/g2
      tandem eval gpqa --csv gpqa_diamond.csv tiny-local --out runs/gpqa1 --resume
      tandem eval rescore runs/gpqa1/responses.jsonl
    """


@eval_command.command("gpqa")
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
@click.option("--no-progress", is_flag=True, help="No live progress bar.")
@click.option(
    "--watch",
    "watch",
    is_flag=True,
    help="Record the DEPLOYMENT's telemetry (`tandem watch`) into OUT/watch while the "
    "eval runs, and judge it there (seed 000's soak).",
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
    """Run GPQA-Diamond (the seed's protocol) against a deployment or a URL.

    Zero-shot simple-evals prompt ending in 'ANSWER: $LETTER', thinking on, temperature 0,
    32768 max tokens, concurrency 2; options shuffled as a pure function of (record id, repeat,
    seed); a thinking-off re-ask for responses without a parsable answer. Every finished
    request is appended to OUT/responses.jsonl, so an interrupted run continues with --resume.

    \b
    Examples:
      tandem eval gpqa --csv gpqa_diamond.csv tiny-local --out runs/gpqa1
      tandem eval gpqa --csv gpqa_diamond.csv --url http://127.0.0.1:8000 --model tiny \\
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
        url, served = front_door(deployment)  # with replicas, through the router
        model = model or served
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
    _show(report, Path(out_dir))
    if watch:
        summary, _ = report_folder(Path(out_dir) / WATCH_DIR)
        click.echo(
            f"watch: {'PASS' if summary.passed else 'FAIL'}, "
            f"{Path(out_dir) / WATCH_DIR / 'report.md'}"
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
    """Re-extract every answer of a saved responses.jsonl and rewrite the reports.

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
    checks: tuple[str, ...],
    needle_lengths: list[int] | None,
    max_model_len: int | None,
    tool_call_parser: str | None,
    reasoning_parser: str | None,
    reference_path: str | None,
    resume: bool,
    force: bool,
    api_key: str | None,
) -> None:
    """The checks to run right after a deployment boots: chat template, greedy determinism,
    tool calls, a long-context needle, reasoning split, speculative acceptance, and the
    answers themselves (against a good revision's --reference).

    Each check is a verdict with its evidence; one that cannot apply says why. Exit status 1
    when any check fails.

    \b
    Examples:
      tandem eval smoke tiny-local --out runs/smoke1
      tandem eval smoke --url http://10.77.0.1:8000 --max-model-len 8192 --out runs/s2
      tandem eval smoke tiny-local --check determinism --out runs/s3
      tandem eval smoke smollm2-local --check answers --reference runs/ref1 --out runs/s4
    """
    reference = load_reference(Path(reference_path)) if reference_path else None
    target = _smoke_target(deployment, url, model, api_key)
    if deployment is None:
        target.max_model_len = max_model_len or target.max_model_len
        target.tool_call_parser = tool_call_parser
        target.auto_tool_choice = tool_call_parser is not None
        target.reasoning_parser = reasoning_parser
    out = ownership.output_folder(Path(out_dir), force=force)
    report = smoke.run_smoke(
        target,
        out,
        api_key=api_key,
        checks=list(checks) or None,
        needle=needle_lengths,
        resume=resume,
        on_result=lambda r: click.echo(f"{r.check:<12} {r.outcome.value:<15} {r.summary}"),
        reference=reference,
    )
    click.echo(f"{'PASS' if report.ok else 'FAIL'}: reports {out / smoke.REPORT_MD}, smoke.json")
    if not report.ok:
        raise click.exceptions.Exit(1)


def _smoke_target(
    deployment: str | None, url: str | None, model: str | None, api_key: str | None
) -> smoke.SmokeTarget:
    """The server a smoke check or a reference is about: a deployment's, or ``--url``'s."""
    if (deployment is None) == (url is None):
        raise SpecError(
            "give either a DEPLOYMENT name or --url, not both and not neither",
            field="DEPLOYMENT/--url",
            hint="e.g. `tandem eval smoke tiny-local --out D`",
        )
    if deployment is not None:
        return smoke.target_of(load_state(deployment), model)
    assert url is not None
    with Endpoint(url, api_key=api_key) as endpoint:
        served = pick_model(endpoint.models(), model)
    return smoke.SmokeTarget(url=url, model=served.id, max_model_len=served.max_model_len)


@eval_command.command("reference")
@click.argument("deployment", required=False)
@url_option
@model_option
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for answers-reference.json (what `eval smoke --reference` takes).",
)
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
    target = _smoke_target(deployment, url, model, api_key)
    sets = reference_sets(Path(prompts_file) if prompts_file else None)
    out = ownership.output_folder(Path(out_dir), force=force)
    client = AnswerClient(target.url, target.model, api_key=api_key)
    try:
        reference = record_reference(client, sets)
    finally:
        client.close()
    written = save_reference(reference, out)
    judged = "" if reference.judgeable else " (its answers are near ties: it cannot judge)"
    click.echo(
        f"recorded {len(reference.answers)} answers of {reference.model} in "
        f"{reference.seconds:.0f} s{judged}: {written}"
    )
