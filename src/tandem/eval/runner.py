"""Running a GPQA evaluation: ask every pending sample with bounded concurrency, log each as it
finishes, show live progress, and build the report from the log.

Steps of ``run_gpqa``:
1. read and check the CSV; lay out the samples (questions × repeats, permuted options);
2. ask the endpoint which models it serves; pick or check the model;
3. open the log (new, or resumed after comparing protocols); skip samples already logged;
4. ask the rest, ``concurrency`` at a time; a response with no parsable answer gets the
   thinking-off re-ask; each finished sample is appended and fsync-ed;
5. re-read the log and write ``report.json``, ``report.md`` and ``report.html``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, SecretStr
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tandem import ownership, screen
from tandem.endpoint import pick_model
from tandem.eval.client import ChatClient, ChatResponse, RetryPolicy
from tandem.eval.dataset import Sample, load_gpqa_csv, make_samples
from tandem.eval.log import (
    LOG_NAME,
    Protocol,
    ResponseLog,
    ResponseRecord,
    SampleRecord,
    SamplingParams,
    read_log,
    sample_key,
)
from tandem.eval.prompt import QUERY_TEMPLATE, fallback_messages, question_prompt
from tandem.eval.report import PUBLISHED_REFERENCE, EvalReport, build_report, write_reports
from tandem.eval.score import ScoredSample, accuracy_of, extract_response, score_sample
from tandem.redact import Redactor, public_url


class GPQAConfig(BaseModel):
    """One GPQA run. Defaults are the seed's protocol: thinking on, temperature 0, 32768 max
    tokens, concurrency 2, one repeat, a thinking-off re-ask for unparsed answers."""

    csv: Path
    url: str
    model: str | None = Field(default=None, description="Default: the one model the server lists.")
    api_key: SecretStr | None = Field(
        default=None, exclude=True, description="Bearer token the server requires."
    )
    out_dir: Path
    limit: int | None = Field(default=None, ge=1, description="Only the first N questions.")
    repeats: int = Field(
        default=1, ge=1, description="Ask each question N times, options re-shuffled each time."
    )
    seed: int = Field(default=0, ge=0, description="Seed of the option order.")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    concurrency: int = Field(default=2, ge=1, description="Requests in flight.")
    fallback: bool = Field(
        default=True, description="Re-ask, thinking off, when a response has no parsable answer."
    )
    fallback_sampling: SamplingParams = Field(
        default_factory=lambda: SamplingParams(
            max_tokens=64, chat_template_kwargs={"thinking": False}
        )
    )
    fallback_context_chars: int = Field(
        default=4000, ge=0, description="Tail of the first response sent back with the re-ask."
    )
    request_timeout_s: float = Field(
        default=3600.0, gt=0, description="Seconds one request may take (sized for 32K tokens)."
    )
    retry_budget_s: float = Field(
        default=900.0,
        ge=0,
        description="Seconds to keep retrying connection errors and 5xx before stopping.",
    )
    resume: bool = False
    reference_accuracy: float | None = Field(
        default=PUBLISHED_REFERENCE, ge=0, le=1, description="Published accuracy shown beside ours."
    )
    progress: bool = True


PROTOCOL_FIELDS = {"seed", "sampling", "fallback", "fallback_sampling", "fallback_context_chars"}
"""The options that are part of a run's ``Protocol`` (what the endpoint is asked)."""

RESCORE = ownership.RunKind(
    "eval rescore",
    "rescored reports",
    resume_flag=None,
    is_own=lambda folder: (folder / "report.json").is_file() and not (folder / LOG_NAME).exists(),
)
"""``eval rescore --out``: the reports of one log, identified by the log, written again."""


def gpqa_identity(config: GPQAConfig) -> dict[str, Any]:
    """What identifies a GPQA run before the server is asked (its run mark): the endpoint and
    what decides what it is asked; the log's header checks the model and data set."""
    return config.model_dump(mode="json", include={"url", *PROTOCOL_FIELDS}) | {
        "url": public_url(config.url)
    }


def run_gpqa(
    config: GPQAConfig, console: Console | None = None, *, claim: ownership.Claim | None = None
) -> EvalReport:
    """Run (or resume) a GPQA evaluation and write its log and reports into ``config.out_dir``.

    Usage:
        report = run_gpqa(GPQAConfig(csv=Path("gpqa_diamond.csv"), url="http://h:8000",
                                     out_dir=Path("runs/gpqa1")))

    ``claim``: ``config.out_dir`` as the command claimed it (``tandem.ownership``), made when
    the log is created.

    Raises:
        SpecError: bad CSV, or a log that cannot be resumed.
        EndpointError: the endpoint is unreachable, lacks the model, or kept failing.
    """
    return asyncio.run(_run(config, console or screen.console(stderr=True), claim))


def rescore_log(
    log_path: str | Path,
    out_dir: str | Path | None = None,
    reference_accuracy: float | None = PUBLISHED_REFERENCE,
) -> EvalReport:
    """Re-extract every answer of a saved log and rewrite the reports (no request is sent)."""
    log_path = Path(log_path)
    contents = read_log(log_path)
    report = build_report(contents, reference_accuracy=reference_accuracy)
    write_reports(report, contents.samples, Path(out_dir) if out_dir else log_path.parent)
    return report


async def _run(config: GPQAConfig, console: Console, claim: ownership.Claim | None) -> EvalReport:
    dataset = load_gpqa_csv(config.csv)
    samples = make_samples(dataset, repeats=config.repeats, seed=config.seed, limit=config.limit)
    retry = RetryPolicy(budget_s=config.retry_budget_s)
    key = config.api_key.get_secret_value() if config.api_key else None
    redactor = Redactor.for_caller([key] if key else [])
    async with ChatClient(
        config.url,
        config.model or "",
        retry=retry,
        api_key=key,
        request_timeout_s=config.request_timeout_s,
    ) as client:
        client.model = pick_model(await client.endpoint.models(timeout_s=30.0), config.model).id
        protocol = Protocol(
            endpoint=public_url(client.endpoint.url),  # a password is sent, not logged or shown
            model=client.model,
            dataset_sha256=dataset.sha256,
            template=QUERY_TEMPLATE,
            **config.model_dump(include=PROTOCOL_FIELDS),
        )
        log = ResponseLog.open(
            config.out_dir / LOG_NAME,
            protocol,
            dataset.path,
            resume=config.resume,
            now=time.time(),
            redactor=redactor,
            claim=claim,
        )
        try:
            prompts = [question_prompt(s) for s in samples]
            keys = [
                sample_key(
                    protocol,
                    prompt=prompt,
                    permutation=s.permutation,
                    record_id=s.question.record_id,
                    repeat=s.repeat,
                )
                for s, prompt in zip(samples, prompts, strict=True)
            ]
            asks = zip(samples, prompts, keys, strict=True)
            pending = [ask for ask in asks if ask[2] not in log.done]
            done = [log.done[key] for key in keys if key in log.done]
            with _Tracker(config, console, total=len(samples), done=done) as tracker:
                await _ask_all(client, config, log, pending, tracker)
        finally:
            log.close()
    contents = read_log(config.out_dir / LOG_NAME)
    report = build_report(
        contents, expected_keys=set(keys), reference_accuracy=config.reference_accuracy
    )
    write_reports(report, contents.samples, config.out_dir, redactor)
    return report


async def _ask_all(
    client: ChatClient,
    config: GPQAConfig,
    log: ResponseLog,
    pending: list[tuple[Sample, str, str]],
    tracker: _Tracker,
) -> None:
    """Ask every pending (sample, prompt, key), ``concurrency`` at a time, logging each."""
    queue: asyncio.Queue[tuple[Sample, str, str]] = asyncio.Queue()
    for ask in pending:
        queue.put_nowait(ask)

    async def worker() -> None:
        while True:
            try:
                ask = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            record = await _ask_one(client, config, *ask)
            log.append(record)
            tracker.finished(record)

    workers = [asyncio.create_task(worker()) for _ in range(min(config.concurrency, len(pending)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def _ask_one(
    client: ChatClient, config: GPQAConfig, sample: Sample, prompt: str, key: str
) -> SampleRecord:
    messages = [{"role": "user", "content": prompt}]
    main = _record(await client.chat(messages, config.sampling.payload()))
    fallback = None
    if config.fallback and main.letter is None and main.error is None:
        previous = "\n".join(p for p in (main.reasoning, main.content) if p)
        fallback = _record(
            await client.chat(
                fallback_messages(prompt, previous, context_chars=config.fallback_context_chars),
                config.fallback_sampling.payload(),
            )
        )
    return SampleRecord(
        key=key,
        record_id=sample.question.record_id,
        repeat=sample.repeat,
        domain=sample.question.domain,
        subdomain=sample.question.subdomain,
        permutation=list(sample.permutation),
        correct_letter=sample.correct_letter,
        prompt=prompt,
        response=main,
        fallback=fallback,
        finished_at=time.time(),
    )


def _record(response: ChatResponse) -> ResponseRecord:
    letter, rule = extract_response(response)
    return ResponseRecord(**response.model_dump(), letter=letter, rule=rule)


class _Tracker:
    """Live progress: done, running accuracy ± 95% interval, ETA, tokens/s."""

    def __init__(
        self, config: GPQAConfig, console: Console, *, total: int, done: list[SampleRecord]
    ) -> None:
        self._scored: list[ScoredSample] = [score_sample(r) for r in done]
        self._tokens = 0
        self._started = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]GPQA[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[accuracy]}"),
            TextColumn("{task.fields[speed]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not config.progress,
            transient=False,
        )
        self._task = self._progress.add_task(
            "gpqa", total=total, completed=len(done), accuracy=self._accuracy_text(), speed=""
        )

    def __enter__(self) -> _Tracker:
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()

    def finished(self, record: SampleRecord) -> None:
        scored = score_sample(record)
        self._scored.append(scored)
        self._tokens += scored.completion_tokens
        elapsed = time.monotonic() - self._started
        self._progress.update(
            self._task,
            advance=1,
            accuracy=self._accuracy_text(),
            speed=f"{self._tokens / elapsed:.1f} tok/s" if elapsed else "",
        )

    def _accuracy_text(self) -> str:
        acc = accuracy_of(self._scored)
        if acc.accuracy is None:
            return "acc n/a"
        half = ((acc.ci95_high or 0) - (acc.ci95_low or 0)) / 2
        return f"acc {100 * acc.accuracy:.1f}% ± {100 * half:.1f}"
