"""Runs a benchmark: load points one after another, each request appended to disk as it ends.

Algorithm of ``LoadGenerator.arun``:

0. Read and check the prompt file, if any (``datasets.load_dataset``): a bad row stops the run
   before anything is sent.
1. Ask the server what it serves (``/v1/models``: model name, max_model_len) and plan the load
   points (``workload.plan_load_points``), every round of them (``workload.schedule``).
2. Idle check: scrape ``/metrics`` twice ``idle_check_s`` apart before sending anything; counters
   that move mean someone else uses the server, and the result carries a warning.
3. Prepare the prompts (``prompt_source``: the synthetic token pool, the prompt file's rows
   measured with the server's tokenizer).
4. Warm-up: ``warmup_requests`` requests, one at a time, discarded.
5. For each load point: build its conversations (untimed), scrape ``/metrics``, then dispatch
   conversations at their scheduled offsets, each waiting for a concurrency slot and sending its
   turns one after the other (a turn carries the earlier answers); every finished request is
   appended to ``requests.jsonl`` and flushed at once. While the point runs, ``/metrics`` is
   sampled for the KV cache peak. Scrape again, difference, and check the server's token counters
   against the sum of the requests' ``usage``. ``summary.json`` is rewritten after every point,
   so a killed run keeps every finished point's summary and every finished request.

Nothing here prints; progress goes to the ``on_progress`` callback (the CLI draws it with rich).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import accumulate
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from tandem import files, wire
from tandem.bench import server_metrics
from tandem.bench.aiohttp_transport import AiohttpTransport
from tandem.bench.config import BenchConfig
from tandem.bench.datasets import DatasetSummary, load_dataset
from tandem.bench.metrics import LoadPointMetrics, load_point_metrics
from tandem.bench.prompt_source import PromptSource
from tandem.bench.records import RequestRecord
from tandem.bench.server_metrics import ServerDelta
from tandem.bench.timed_request import (
    ENDPOINTS,
    Clock,
    Exchange,
    RequestSlot,
    Sampling,
    send_request,
    server_version,
)
from tandem.bench.workload import LoadPoint, arrival_offsets_s, plan_load_points, schedule
from tandem.endpoint import AsyncEndpoint, pick_model
from tandem.errors import Problem, SpecError
from tandem.jsonfiles import JsonLines, read_jsonl
from tandem.ownership import RunKind
from tandem.redact import Redactor, public_url
from tandem.version import TANDEM_VERSION
from tandem.vllm_metrics import MetricsSnapshot

SCHEMA_VERSION = 1
REQUESTS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"
RUN = RunKind(
    "bench run",
    "a bench run",
    is_own=lambda folder: (folder / SUMMARY_FILE).is_file() or (folder / REQUESTS_FILE).is_file(),
)
"""A bench run's ``--out`` folder (``tandem.ownership``): identified by its ``BenchConfig``."""


class ServerInfo(BaseModel):
    """The server as it described itself at the start of the run."""

    url: str
    model: str
    max_model_len: int | None = None
    version: str | None = Field(default=None, description="vLLM's /version, when it has one.")


class LoadPointResult(BaseModel):
    """One load point: what was asked, what the client measured, what the server counted."""

    model_config = ConfigDict(extra="forbid")

    point: LoadPoint
    metrics: LoadPointMetrics
    server: ServerDelta | None = None
    decode_roofline_fraction: float | None = Field(
        default=None,
        description="Single-stream decode speed (1 / median TPOT) over the "
        "planner's roofline; only for concurrency-1 points.",
    )
    warnings: list[str] = Field(default_factory=list)


class BenchResult(BaseModel):
    """The versioned summary of a run (``summary.json``); every report is made from it."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    tool: Literal["tandem bench"] = "tandem bench"
    tandem_version: str | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    finished: bool = Field(default=False, description="False while running or when killed.")
    config: BenchConfig
    server: ServerInfo
    points: list[LoadPointResult] = Field(
        default_factory=list, description="Every measured point of every round, in order."
    )
    dataset: DatasetSummary | None = Field(
        default=None, description="What the run took from its prompt file, if any."
    )
    warnings: list[str] = Field(default_factory=list)

    def rounds_of(self, label: str) -> list[LoadPointResult]:
        """The point's results, one per round measured."""
        return [p for p in self.points if p.point.label == label]

    def labels(self) -> list[str]:
        """The points' labels, each once, in the order measured."""
        return list(dict.fromkeys(p.point.label for p in self.points))


@dataclass(frozen=True)
class ProgressEvent:
    """Where a run stands; sent after every request and at each phase change."""

    phase: Literal["prepare", "warmup", "run", "done"]
    point: LoadPoint | None
    point_index: int
    points: int
    done: int = 0
    total: int = 0
    errors: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


ProgressCallback = Callable[[ProgressEvent], None]


class LoadGenerator:
    """Runs the load points of one ``BenchConfig`` against one server.

    Usage:
        generator = LoadGenerator(config, out_dir=Path("runs/b1"))
        result = asyncio.run(generator.arun())

    Args:
        config: what to measure.
        out_dir: where ``requests.jsonl`` and ``summary.json`` go; None keeps results in memory.
        on_progress: called after every request and at each phase; must not block.
        clock: monotonic seconds (``time.perf_counter``); injectable for tests.
        resume: continue the run already in ``out_dir``: its finished load points are kept
            (summary and records), the point it was killed in is run again from its start.
            Without it, an ``out_dir`` holding a run is refused, never overwritten.
    """

    def __init__(
        self,
        config: BenchConfig,
        out_dir: Path | None = None,
        on_progress: ProgressCallback | None = None,
        clock: Clock = time.perf_counter,
        *,
        resume: bool = False,
    ) -> None:
        self.config = config
        self.out_dir = out_dir
        self.resume = resume
        self.on_progress = on_progress or (lambda event: None)
        self.clock = clock
        self.endpoint = ENDPOINTS[config.endpoint]
        self.records: list[RequestRecord] = []
        self.api_key = config.api_key.get_secret_value() if config.api_key else None
        self.redactor = Redactor.for_caller([self.api_key] if self.api_key else [])
        """Every file of the run is written through it: it also knows a key given as
        ``--api-key`` (not in the environment)."""

    async def arun(self) -> BenchResult:
        config = self.config
        dataset = (
            load_dataset(config.prompt_file, config.prompt_column) if config.prompt_file else None
        )
        previous = self._previous_run()
        timeout = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None)
        transport = AiohttpTransport(max_connections=None, clock=self.clock)
        # identity: the SSE parser reads raw bytes, so a proxy must not compress the stream
        headers = {"Accept-Encoding": "identity", **wire.bearer(self.api_key)}
        async with httpx.AsyncClient(
            transport=transport, timeout=timeout, headers=headers
        ) as client:
            self.client = client
            self.send = partial(
                send_request,
                client,
                config.url,
                self.endpoint,
                timeout_s=config.request_timeout_s,
                clock=self.clock,
            )
            server = await self._server_info()
            points = schedule(plan_load_points(config, server.max_model_len), config.rounds)
            result = previous or BenchResult(
                config=config, server=server, tandem_version=TANDEM_VERSION
            )
            if previous is not None and previous.server.model != server.model:
                raise SpecError(
                    f"the run in {self.out_dir} measured '{previous.server.model}', "
                    f"the server now serves '{server.model}'",
                    field="model",
                    hint="resume against the same model, or choose another --out",
                )
            done = {(p.point.label, p.point.round) for p in result.points}
            self.on_progress(ProgressEvent("prepare", None, 0, len(points)))
            warnings = []
            if config.scrape_metrics and config.idle_check_s > 0:
                warnings += await self._idle_check()
            self.source = PromptSource(
                client, config, self.endpoint.name, server.model, server.max_model_len
            )
            warnings += await self.source.prepare(points, dataset)
            result.dataset = self.source.summary
            result.warnings += [w for w in warnings if w not in result.warnings]
            jsonl = self._open_records(keep=done, warnings=result.warnings)
            try:
                todo = [(i, p) for i, p in enumerate(points) if (p.label, p.round) not in done]
                await self._warmup(todo[0][1] if todo else None, server.model, len(points))
                for i, point in todo:
                    result.points.append(
                        await self._run_point(point, i, len(points), server.model, jsonl)
                    )
                    self._write_summary(result)
            finally:
                if jsonl is not None:
                    jsonl.close()
            result.finished = True
            self._write_summary(result)
            self.on_progress(ProgressEvent("done", None, len(points), len(points)))
            return result

    # --- phases ---------------------------------------------------------------------------

    async def _server_info(self) -> ServerInfo:
        models = await AsyncEndpoint(self.config.url, client=self.client).models()
        chosen = pick_model(models, self.config.model)
        return ServerInfo(
            url=public_url(self.config.url),
            model=chosen.id,
            max_model_len=chosen.max_model_len,
            version=await server_version(self.client, self.config.url),
        )

    async def _idle_check(self) -> list[str]:
        before = await server_metrics.scrape(self.client, self.config.url)
        await asyncio.sleep(self.config.idle_check_s)
        after = await server_metrics.scrape(self.client, self.config.url)
        if before is None or after is None:
            return []
        moved = server_metrics.counters_moved(before, after)
        if not moved:
            return []
        return [
            f"server counters moved while the benchmark was idle ({', '.join(moved)} in "
            f"{self.config.idle_check_s:g} s): another client uses this server, so "
            "latencies and server deltas include its load"
        ]

    async def _warmup(self, first: LoadPoint | None, model: str, points: int) -> None:
        if first is None or self.config.warmup_requests == 0:
            return
        total = self.config.warmup_requests
        self.on_progress(ProgressEvent("warmup", first, 0, points, total=total))
        shape = first.model_copy(update={"output_tokens": min(first.output_tokens, 16)})
        prompts = await self.source.warmup(shape, self.config.warmup_requests)
        sampling = self._sampling(shape)
        for i, prompt in enumerate(prompts):
            payload = self.endpoint.payload(model, prompt, sampling)
            await self.send(payload, RequestSlot(i, "warmup", 0.0), origin=self.clock())
            done = ProgressEvent("warmup", first, 0, points, done=i + 1, total=len(prompts))
            self.on_progress(done)

    def _sampling(self, point: LoadPoint) -> Sampling:
        c = self.config
        return Sampling(
            max_tokens=point.output_tokens,
            ignore_eos=c.ignore_eos,
            temperature=c.temperature,
            extra_body=c.extra_body,
        )

    async def _run_point(
        self, point: LoadPoint, index: int, points: int, model: str, jsonl: files.LineLog | None
    ) -> LoadPointResult:
        config = self.config
        conversations = await self.source.conversations(point, index)
        sampling = self._sampling(point)
        first_payloads = [
            self.endpoint.payload(model, c.prompt(0), sampling) for c in conversations
        ]
        multi_turn = config.turns > 1 and point.kind != "long-context"
        first_index = list(accumulate((len(c.turns) for c in conversations), initial=0))
        offsets = arrival_offsets_s(
            len(conversations),
            point.rate_rps,
            point.burstiness if point.burstiness is not None else 1.0,
            seed=config.seed + index,
        )
        before = (
            await server_metrics.scrape(self.client, config.url) if config.scrape_metrics else None
        )
        samples: list[MetricsSnapshot] = []
        sampler = None
        if before is not None and config.kv_sample_interval_s > 0:
            sampler = asyncio.create_task(self._sample(samples))

        records: list[RequestRecord] = []
        slots = asyncio.Semaphore(point.concurrency) if point.concurrency else None
        origin = self.clock()
        counts = {"errors": 0, "tokens": 0, "unsent": 0}

        async def send(i: int, turn: int, scheduled: float, history: tuple[Exchange, ...]):
            conversation = conversations[i]
            last = turn == len(conversation.turns) - 1
            answer: list[str] | None = None if last else []
            payload = (
                first_payloads[i]
                if turn == 0
                else self.endpoint.payload(model, conversation.prompt(turn, history), sampling)
            )
            record = await self.send(
                payload,
                RequestSlot(
                    first_index[i] + turn,
                    point.label,
                    scheduled,
                    round=point.round,
                    conversation=i if multi_turn else None,
                    turn=turn + 1 if multi_turn else None,
                    prefix_group=conversation.group,
                ),
                origin=origin,
                answer=answer,
            )
            records.append(record)
            if jsonl is not None:
                jsonl.write_json(record)
            counts["errors"] += not record.ok
            if record.ok:
                counts["tokens"] += record.output_tokens or 0
            self.on_progress(
                ProgressEvent(
                    "run",
                    point,
                    index,
                    points,
                    done=len(records),
                    total=first_index[-1] - counts["unsent"],
                    errors=counts["errors"],
                    output_tokens=counts["tokens"],
                    elapsed_s=self.clock() - origin,
                )
            )
            return record, "".join(answer or ())

        async def one(i: int, scheduled: float) -> None:
            """Conversation i, turn after turn; a failed turn ends it (the next would lack
            its answer)."""
            turns = conversations[i].turns
            history: tuple[Exchange, ...] = ()
            try:
                for turn in range(len(turns)):
                    at = scheduled if turn == 0 else self.clock() - origin
                    record, answer = await send(i, turn, at, history)
                    if not record.ok:
                        counts["unsent"] += len(turns) - turn - 1
                        break
                    history = (*history, Exchange(turns[turn].text, answer))
            finally:
                if slots is not None:
                    slots.release()

        self.on_progress(ProgressEvent("run", point, index, points, total=first_index[-1]))
        tasks = []
        for i, offset in enumerate(offsets):
            delay = origin + offset - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is not None:
                await slots.acquire()
            tasks.append(asyncio.create_task(one(i, offset)))
        await asyncio.gather(*tasks)

        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        after = await server_metrics.scrape(self.client, config.url) if before else None
        records.sort(key=lambda r: r.index)
        self.records += records
        metrics = load_point_metrics(records, config.slo)
        delta = server_metrics.server_delta(before, after, samples) if before and after else None
        warnings = (
            _consistency_warnings(records, delta)
            + coalescing_warnings(metrics, delta)
            + replay_warnings(config, delta)
        )
        if counts["unsent"]:
            warnings.append(
                f"{counts['unsent']} later turns were not sent: a conversation ends at its "
                "first failed turn"
            )
        return LoadPointResult(
            point=point,
            metrics=metrics,
            server=delta,
            decode_roofline_fraction=_roofline_fraction(point, metrics, config),
            warnings=warnings,
        )

    async def _sample(self, into: list[MetricsSnapshot]) -> None:
        while True:
            await asyncio.sleep(self.config.kv_sample_interval_s)
            snap = await server_metrics.scrape(self.client, self.config.url)
            if snap is not None:
                into.append(snap)

    # --- output ---------------------------------------------------------------------------

    def _previous_run(self) -> BenchResult | None:
        """The run to continue from ``out_dir``; refuses to overwrite one without ``resume``.

        Raises:
            SpecError: ``out_dir`` holds a run and resume was not asked for; its summary is not
                a tandem bench summary; or it was run with other options.
        """
        if self.out_dir is None:
            return None
        summary, requests = self.out_dir / SUMMARY_FILE, self.out_dir / REQUESTS_FILE
        if not summary.exists() and not requests.exists():
            return None
        if not self.resume:
            raise SpecError(
                f"{self.out_dir} already holds a benchmark run",
                field="--out",
                file=str(self.out_dir),
                hint="pass --resume to continue it (finished load points are "
                "kept), or choose another --out",
            )
        if not summary.exists():  # killed during the first point: nothing finished yet
            return None
        try:
            previous = BenchResult.model_validate_json(summary.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise SpecError(
                "not a tandem bench summary", file=str(summary), hint="choose another --out"
            ) from exc
        theirs, ours = previous.config.model_dump(), self.config.model_dump()
        problems = [
            Problem(name, f"the run used {theirs.get(name)!r}, now {value!r}")
            for name, value in ours.items()
            if theirs.get(name) != value
        ]
        if problems:
            raise SpecError(
                "a run resumes only with the options it started with",
                file=str(summary),
                problems=problems,
                hint="repeat the first command with --resume",
            )
        previous.finished = False
        return previous

    def _open_records(
        self, keep: set[tuple[str, int]], warnings: list[str]
    ) -> files.LineLog | None:
        """``requests.jsonl`` for appending, holding only the records of the (label, round)
        points in ``keep`` (a resumed run drops the records of the point it was killed in); damaged
        lines it drops are said in ``warnings``."""
        if self.out_dir is None:
            return None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / REQUESTS_FILE
        read = read_records(path) if path.exists() else JsonLines[RequestRecord]()
        if read.damaged:
            warnings.append(f"{path}: {read.skipped_note}; their requests are not in the plots")
        kept = [r for r in read.records if (r.load_point, r.round) in keep]
        self.records += kept
        files.write_jsonl(path, kept, redactor=self.redactor)
        return files.LineLog(path, redactor=self.redactor)

    def _write_summary(self, result: BenchResult) -> None:
        if self.out_dir is None:
            return
        files.write_json(self.out_dir / SUMMARY_FILE, result, redactor=self.redactor)


def _consistency_warnings(records: list[RequestRecord], delta: ServerDelta | None) -> list[str]:
    """Compare the requests' usage with the server's counters for the same window."""
    if delta is None:
        return []
    warnings = []
    out = sum(r.output_tokens or 0 for r in records if r.output_tokens_from_usage)
    prompt = sum(r.prompt_tokens or 0 for r in records)
    failed = sum(1 for r in records if not r.ok)
    pairs = (("generation", out, delta.generation_tokens), ("prompt", prompt, delta.prompt_tokens))
    for name, ours, theirs in pairs:
        if theirs is not None and theirs != ours:
            why = (
                f"{failed} failed requests may have used tokens without reporting usage"
                if failed
                else "another client probably used the server meanwhile"
            )
            warnings.append(
                f"server counted {theirs} {name} tokens, requests' usage sums to {ours} ({why})"
            )
    return warnings


def coalescing_warnings(metrics: LoadPointMetrics, delta: ServerDelta | None) -> list[str]:
    """Warn when the server merged several decode steps into one chunk.

    One chunk carries one token per decode step (more with speculative decoding: the accepted
    length). Many more per chunk means the server's API process fell behind its engine and
    sent what had piled up at once (seen on vLLM-CPU sharing two cores: whole answers in one
    chunk). Then the first token arrives late and the gaps between chunks no longer show decode
    speed, so the point's TTFT, ITL and TPOT describe the API process, not the model.
    """
    per_chunk = metrics.tokens_per_chunk.p50
    per_step = delta.spec_acceptance_length if delta and delta.spec_acceptance_length else 1.0
    if per_chunk is None or per_chunk <= max(2.0, 2 * per_step):
        return []
    return [
        f"the server sent {per_chunk:.1f} tokens per chunk (median) for {per_step:.2f} per "
        f"decode step: it merged steps, so TTFT, ITL and TPOT here measure its API process "
        f"falling behind, not decoding; rerun with the server's host less loaded"
    ]


REPLAYED_HIT_RATE = 0.1
"""A prefix-cache hit rate above which prompts that share nothing were sent to the server before."""


def replay_warnings(config: BenchConfig, delta: ServerDelta | None) -> list[str]:
    """Warn when the server's prefix cache answered prompts that share nothing with each other.

    Without a shared prefix, later turns or a prompt file (whose rows may share a system
    prompt), no two prompts of a point have a common block, so hits mean the server had seen
    these very prompts: an earlier run with the same ``seed`` (prompts are seeded, as in vLLM's
    and GuideLLM's clients). Their prefill is then skipped, and the point's TTFT and throughput
    describe a cache, not the model (a search's probes once agreed with GuideLLM only after
    this was found by hand, ``tandem.bench.slo_search``).
    """
    rate = delta.prefix_cache_hit_rate if delta else None
    shares = (
        (config.prefix_tokens and config.prefix_groups) or config.turns > 1 or config.prompt_file
    )
    if rate is None or rate <= REPLAYED_HIT_RATE or shares:
        return []
    return [
        f"the server's prefix cache answered {rate:.0%} of the prompt tokens, though no two "
        f"prompts here share a prefix: it had seen them before (a run with --seed "
        f"{config.seed} against this server?), so TTFT and throughput are flattered; run again "
        "with another --seed"
    ]


def _roofline_fraction(
    point: LoadPoint, metrics: LoadPointMetrics, config: BenchConfig
) -> float | None:
    tpot = metrics.tpot_s.p50
    if config.roofline_decode_tok_s is None or point.concurrency != 1 or not tpot:
        return None
    return (1.0 / tpot) / config.roofline_decode_tok_s


def run(
    config: BenchConfig,
    out_dir: Path | None = None,
    on_progress: ProgressCallback | None = None,
    *,
    resume: bool = False,
) -> BenchResult:
    """Run (or, with ``resume``, continue) a benchmark to the end and return its summary.

    Usage:
        result = run(BenchConfig(url="http://127.0.0.1:8000", concurrency=[1, 4]), Path("runs/b1"))

    Raises:
        EndpointError: the server cannot be reached or does not serve the model.
        SpecError: the workload does not fit the model (e.g. too long for max_model_len).
    """
    # uvloop's event loop takes about 15% off the client's CPU per streamed token
    # (benchmarks/client_cpu.py); the load generator runs on it wherever it is installed.
    with asyncio.Runner(loop_factory=_fast_loop_factory()) as runner:
        return runner.run(LoadGenerator(config, out_dir, on_progress, resume=resume).arun())


def _fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # Windows: no uvloop; asyncio's loop is correct, only slower
        return None
    return uvloop.new_event_loop


def read_records(path: Path) -> JsonLines[RequestRecord]:
    """Records of a ``requests.jsonl``; a half-written last line (killed run) is skipped, and
    damaged lines are counted (``tandem.jsonfiles``).

    Raises:
        SpecError: the file cannot be read, or no line of it is a request record.
    """
    return read_jsonl(
        path,
        RequestRecord.model_validate,
        what="request record",
        hint="give a run folder as `tandem bench --out` wrote it, or run the benchmark again",
    )
