"""The health model: is a running deployment healthy, and if not, which rank and what evidence.

One model for ``tandem status``, ``tandem supervise``, ``tandem watch`` and the Kubernetes
probes. ``/health`` alone proves little: vLLM's API server answers 200 while a headless worker
is dead (until the next request fails and the leader exits) and while a hung engine makes no
progress. So a deployment is judged from four kinds of evidence:

1. **processes** — every process a rank had when the deployment became ready (main ``vllm
   serve``, ``VLLM::EngineCore``, ``VLLM::Worker_TPn``) is still alive and not stopped; the
   backend lists them (``Backend.observe``), on remote nodes too;
2. **the leader's API** — ``GET /health`` answers 200;
3. **forward progress** — while requests run (``vllm:num_requests_running`` > 0), the token
   counters must move; a silent server gets a canary, a 1-token completion with a deadline.
   Long prefills do not read as a stall: chunked prefill schedules the canary beside them, and
   the first request's JIT was paid by readiness;
4. **error signatures** in the rank logs since ready (``EngineDeadError``, NCCL watchdog
   timeouts, CUDA errors, out-of-memory).

Each rank gets a ``Health`` (``state``, ``reason``, ``evidence``: the line that shows it), and the
deployment one ``Verdict``, the worst that applies:

- ``down``: the leader is gone or does not answer ``/health`` (or no rank runs at all); when
  its processes or log show why (a process gone, stopped, a fatal error), that is the reason;
- ``stalled``: everything is alive but nothing moves (a process stopped, a canary past its
  deadline, counters frozen under load);
- ``degraded``: the API answers, but a rank lost a process or logged a fatal error (requests
  will fail);
- ``starting``: not ready yet, ranks alive;
- ``healthy``: none of the above.

Usage::

    from tandem.operations.health import assess
    report = assess(load_state("tiny-local"))
    report.verdict, report.rank, report.reason, report.evidence

``judge`` is the pure part (facts in, verdict out); ``assess`` gathers the facts.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import httpx
from pydantic import BaseModel, Field

from tandem import wire
from tandem.backends.base import Backend, Look, ProcessFact, RankObservation, backend_for
from tandem.backends.launch import interrupted
from tandem.backends.state import GroupState, RankState
from tandem.endpoint import Endpoint
from tandem.errors import EndpointError
from tandem.vllm_metrics import (
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    parse_metrics,
)


class Verdict(StrEnum):
    """The one word for a deployment's health; it owns how it is shown and what ``tandem
    status`` exits with, so status, watch and the reports cannot disagree."""

    STARTING = "starting"
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    STALLED = "stalled"
    DOWN = "down"

    @property
    def colour(self) -> str:
        """The rich style of the word: green serves, cyan is on its way, yellow serves with a
        rank lost, red does not serve."""
        return _VERDICT_SHOWN[self][0]

    @property
    def exit_code(self) -> int:
        """``tandem status``'s exit status: 0 healthy, 3 starting, 4 degraded, 5 stalled,
        6 down (1 and 2 are taken by a failed check and a user error)."""
        return _VERDICT_SHOWN[self][1]


_VERDICT_SHOWN = {  # (colour, exit code)
    Verdict.HEALTHY: ("green", 0),
    Verdict.STARTING: ("cyan", 3),
    Verdict.DEGRADED: ("yellow", 4),
    Verdict.STALLED: ("red", 5),
    Verdict.DOWN: ("bold red", 6),
}


class RankCondition(StrEnum):
    """One rank's health in a word, from its processes, its log and (for the leader) its API."""

    HEALTHY = "healthy"
    STARTING = "starting"
    DEAD = "dead"
    """No process of the rank is alive."""
    BROKEN = "broken"
    """Some of its processes are gone, or its node reports a problem."""
    STALLED = "stalled"
    """A process is stopped (a signal or a debugger) and runs no code."""
    ERROR = "error"
    """Its log since ready shows a fatal error while the processes live."""
    UNREACHABLE = "unreachable"
    """Its node could not be asked."""
    NOT_ANSWERING = "not-answering"
    """The leader's processes live but its /health does not answer."""

    @property
    def colour(self) -> str:
        return {RankCondition.HEALTHY: "green", RankCondition.STARTING: "cyan"}.get(self, "red")


_FINE = (RankCondition.HEALTHY, RankCondition.STARTING)
_LOST_PROCESSES = (RankCondition.DEAD, RankCondition.BROKEN)
_EXPLAINS_SILENCE = (RankCondition.BROKEN, RankCondition.STALLED, RankCondition.ERROR)
"""What the process table or the log say that makes a silent /health need no more looks."""


class Health(BaseModel):
    """One rank's health."""

    state: RankCondition
    reason: str = ""
    evidence: str = Field(default="", description="The fact or log line that shows it.")


class RankHealth(BaseModel):
    rank: int
    role: str
    node: str
    health: Health
    processes: list[ProcessFact] = Field(default_factory=list)


class ApiFacts(BaseModel):
    """What the leader's API said."""

    health_status: int | None = None
    health_error: str | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    tokens_moved: bool | None = Field(
        default=None,
        description="Prompt or generation tokens "
        "counted between two scrapes; None with one scrape.",
    )
    stalled_for_s: float | None = Field(
        default=None,
        description="How long counters have not "
        "moved under load (from a tracker that keeps history).",
    )
    canary: str = Field(default="skipped", description="ok, timeout, error or skipped.")
    canary_s: float | None = None
    canary_detail: str = ""
    metrics_text: str | None = Field(
        default=None,
        exclude=True,
        description="The last /metrics page as served, for a caller that records more of it "
        "(a watch sample) without a second scrape.",
    )
    metrics_s: float | None = Field(default=None, exclude=True, description="Its scrape's time.")

    @property
    def answers(self) -> bool:
        return self.health_status == 200


class Assessment(BaseModel):
    """The verdict on a deployment, the rank it is about, and why."""

    name: str
    verdict: Verdict
    rank: int | None = None
    reason: str = ""
    evidence: str = ""
    ranks: list[RankHealth] = Field(default_factory=list)
    api: ApiFacts = Field(default_factory=ApiFacts)
    checked_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def only_the_api_is_silent(self) -> bool:
        """Down only because the leader's /health did not answer, every process in place: one
        miss may be a slow answer, so a watcher counts several before it acts."""
        return (
            self.verdict is Verdict.DOWN
            and self.rank is not None
            and all(
                r.health.state in (RankCondition.HEALTHY, RankCondition.NOT_ANSWERING)
                for r in self.ranks
            )
        )


# Log lines that mean a rank's engine is broken even while its processes live.
ERROR_SIGNATURES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"EngineDeadError|EngineCore encountered a fatal error|Engine core.*died"),
        "the engine died",
    ),
    (
        re.compile(
            r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imed? ?out|"
            r"NCCL (?:error|timeout)|ncclUnhandledCudaError|ncclSystemError"
        ),
        "an NCCL collective failed or timed out",
    ),
    (re.compile(r"CUDA error|cudaError\w+|an illegal memory access"), "a CUDA error"),
    (
        re.compile(r"OutOfMemoryError|CUDA out of memory|Out of memory: Killed process|oom-kill"),
        "out of memory",
    ),
    (
        re.compile(
            r"Worker(?:Proc)? .*died unexpectedly|RuntimeError: .*Connection closed by peer|"
            r"Gloo.*(?:Connection reset|Connection closed)"
        ),
        "a peer rank went away",
    ),
]


def error_signature(lines: list[str]) -> tuple[str, str] | None:
    """(what it means, the line) of the first fatal-looking line, or None."""
    for line in lines:
        for pattern, meaning in ERROR_SIGNATURES:
            if pattern.search(line):
                return meaning, line.strip()[:400]
    return None


def rank_health(record: RankState, seen: RankObservation, *, ready: bool) -> Health:
    """One rank's health from its recorded processes and what its node shows now (pure)."""
    if seen.unreachable:
        return Health(
            state=RankCondition.UNREACHABLE,
            reason=f"node {record.node} could not be asked",
            evidence=seen.unreachable,
        )
    alive = {p.pid: p for p in seen.processes}
    if not alive and seen.alive is not True:
        expected = ", ".join(f"{p.name} {p.pid}" for p in record.processes) or f"pid {record.pid}"
        return Health(
            state=RankCondition.DEAD,
            reason=f"no process of rank {record.rank} is alive",
            evidence=f"expected: {expected}",
        )
    if p := next((p for p in seen.processes if p.state in ("T", "t")), None):
        return Health(
            state=RankCondition.STALLED,
            reason=f"{p.name} (pid {p.pid}) is stopped and runs no code",
            evidence=f"/proc/{p.pid}/stat state {p.state}",
        )
    if seen.problem:
        return Health(
            state=RankCondition.BROKEN,
            reason=seen.problem,
            evidence=", ".join(f"{p.name} {p.pid}" for p in seen.processes),
        )
    missing = [p for p in record.processes if p.pid not in alive]
    if missing:
        gone = ", ".join(f"{p.name} (pid {p.pid})" for p in missing)
        left = ", ".join(f"{p.name} {p.pid}" for p in seen.processes) or "none"
        return Health(
            state=RankCondition.BROKEN,
            reason=f"{gone} of rank {record.rank} {'is' if len(missing) == 1 else 'are'} gone",
            evidence=f"left: {left}",
        )
    if found := error_signature(seen.log_since_ready):
        return Health(state=RankCondition.ERROR, reason=found[0], evidence=found[1])
    if not ready:
        return Health(state=RankCondition.STARTING, reason="start-up in progress")
    return Health(state=RankCondition.HEALTHY)


def judge(
    state: GroupState,
    look: Look,
    api: ApiFacts,
    *,
    stall_s: float = 30.0,
) -> Assessment:
    """The verdict from the facts (pure)."""
    ranks = [
        RankHealth(
            rank=r.rank,
            role=r.role,
            node=r.node,
            health=rank_health(r, look.rank(r.rank), ready=state.ready),
            processes=look.rank(r.rank).processes,
        )
        for r in sorted(state.ranks, key=lambda r: r.rank)
    ]

    def verdict(v: Verdict, rank: int | None, reason: str, evidence: str = "") -> Assessment:
        return Assessment(
            name=state.name,
            verdict=v,
            rank=rank,
            reason=reason,
            evidence=evidence,
            ranks=ranks,
            api=api,
        )

    def of_rank(v: Verdict, r: RankHealth, lead: str = "") -> Assessment:
        """The verdict about rank ``r``, in its own reason and evidence."""
        return verdict(v, r.rank, lead + r.health.reason, r.health.evidence)

    leader = next((r for r in ranks if r.role == "leader"), ranks[0] if ranks else None)
    if leader is None or all(r.health.state is RankCondition.DEAD for r in ranks):
        return verdict(Verdict.DOWN, None, "no rank is running")
    if not state.ready:
        if dead := next((r for r in ranks if r.health.state in _LOST_PROCESSES), None):
            return of_rank(Verdict.DOWN, dead, "start-up broke: ")
        if interrupted(state):
            return verdict(
                Verdict.DEGRADED,
                None,
                f"the `up` that launched it (pid {state.launcher_pid}) is gone and it never "
                "became ready: nothing waits for it; `tandem up` clears and starts it again, "
                "`tandem down` stops it",
            )
        return verdict(Verdict.STARTING, None, "start-up in progress")
    if leader.health.state is RankCondition.DEAD:
        return of_rank(Verdict.DOWN, leader)
    silence = api.health_error or f"HTTP {api.health_status}"
    if not api.answers and leader.health.state in _EXPLAINS_SILENCE:
        # The process table or the log already says why /health is silent (its main process
        # gone, say): that is the verdict, at once, with the pid; no more looks will add to it.
        return verdict(
            Verdict.DOWN,
            leader.rank,
            f"{leader.health.reason}, and the leader does not answer /health",
            "; ".join(e for e in (leader.health.evidence, silence) if e),
        )
    if not api.answers:
        leader.health = Health(
            state=RankCondition.NOT_ANSWERING,
            reason="the leader does not answer /health",
            evidence=silence,
        )
        return of_rank(Verdict.DOWN, leader)
    if stalled := next((r for r in ranks if r.health.state is RankCondition.STALLED), None):
        return of_rank(Verdict.STALLED, stalled)
    if api.canary == "timeout":
        return verdict(
            Verdict.STALLED,
            None,
            "the engine makes no progress: a 1-token completion did not finish in time",
            api.canary_detail,
        )
    if api.stalled_for_s is not None and api.stalled_for_s >= stall_s:
        return verdict(
            Verdict.STALLED,
            None,
            f"{api.requests_running:g} request(s) running "
            f"but no token counted for {api.stalled_for_s:.0f} s",
            f"{REQUESTS_RUNNING} {api.requests_running:g}",
        )
    if broken := next((r for r in ranks if r.health.state not in _FINE), None):
        return of_rank(Verdict.DEGRADED, broken)
    if api.canary == "error":
        return verdict(
            Verdict.DEGRADED, leader.rank, "a 1-token completion failed", api.canary_detail
        )
    return verdict(
        Verdict.HEALTHY,
        None,
        "every rank alive, the API answers"
        + (", tokens move" if api.tokens_moved else "")
        + (", a canary answered" if api.canary == "ok" else ""),
    )


# --- gathering the facts ------------------------------------------------------------------


@dataclass
class ProgressTracker:
    """Remembers when the token counters last moved, across calls (supervise, watch)."""

    last_tokens: float | None = None
    last_moved_s: float | None = None
    clock: Callable[[], float] = time.monotonic

    def update(self, running: float | None, tokens: float | None) -> float | None:
        """Seconds the counters have stood still under load (None when idle or unknown)."""
        now = self.clock()
        if tokens is None:
            return None
        if self.last_tokens is None or tokens != self.last_tokens or not running:
            self.last_tokens, self.last_moved_s = tokens, now
            return None
        return now - self.last_moved_s if self.last_moved_s is not None else 0.0


def _scrape(server: Endpoint, facts: ApiFacts) -> float | None:
    """One GET /metrics: the queue into ``facts`` (and the page, for a watch); returns prompt +
    generation tokens, None when the scrape or the counters fail."""
    started = time.perf_counter()
    try:
        response = server.client.get(
            server.url + wire.METRICS_PATH,
            timeout=5,
            headers={**server.headers, "Accept-Encoding": "identity"},
        )
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    facts.metrics_text, facts.metrics_s = response.text, time.perf_counter() - started
    snapshot = parse_metrics(response.text)
    facts.requests_running = snapshot.get(REQUESTS_RUNNING)
    facts.requests_waiting = snapshot.get(REQUESTS_WAITING)
    tokens = [snapshot.get(PROMPT_TOKENS), snapshot.get(GENERATION_TOKENS)]
    return sum(t for t in tokens if t is not None) if any(t is not None for t in tokens) else None


def canary(server: Endpoint, model: str, *, timeout_s: float) -> tuple[str, float, str]:
    """Send a 1-token completion; (ok|timeout|error, seconds, detail)."""
    started = time.monotonic()
    try:
        response = server.client.post(
            server.url + wire.COMPLETIONS_PATH,
            timeout=timeout_s,
            headers=server.headers,
            json={"model": model, "prompt": "health", "max_tokens": 1, "temperature": 0},
        )
    except httpx.TimeoutException:
        return (
            "timeout",
            time.monotonic() - started,
            f"POST /v1/completions max_tokens=1: no answer in {timeout_s:g} s",
        )
    except httpx.HTTPError as exc:
        return "error", time.monotonic() - started, f"POST /v1/completions: {exc}"
    took = time.monotonic() - started
    if response.status_code != 200:
        return (
            "error",
            took,
            f"POST /v1/completions: HTTP {response.status_code} {response.text[:200]}",
        )
    return "ok", took, f"1 token in {took:.2f} s"


@functools.cache
def _http() -> httpx.Client:
    """One client per process: building one loads the CA bundle (~35 ms), which a watch or
    supervisor would pay at every look. No keep-alive: vLLM closes idle connections after
    5 s, the interval such callers look at, and a reused one can race that close."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def probe_api(
    state: GroupState,
    *,
    canary_mode: str = "idle",
    canary_timeout_s: float = 5.0,
    window_s: float = 2.0,
    tracker: ProgressTracker | None = None,
    api_key: str | None = None,
) -> ApiFacts:
    """Ask the leader: /health, /metrics and, when it helps, a canary.

    ``canary_mode``: ``idle`` sends one only when no request runs or the counters did not move
    across ``window_s``; ``always``; ``never``.
    """
    facts = ApiFacts()
    server = Endpoint(state.endpoint, api_key=api_key, client=_http())
    try:
        facts.health_status = server.health_status(timeout_s=3)
    except EndpointError as exc:
        facts.health_error = exc.message
    if not facts.answers:
        return facts
    tokens = _scrape(server, facts)
    running = facts.requests_running
    if tracker is not None:
        facts.stalled_for_s = tracker.update(running, tokens)
    elif running:
        time.sleep(window_s)
        facts.tokens_moved = _scrape(server, facts) != tokens
    busy_and_moving = bool(running) and (
        facts.tokens_moved or (tracker is not None and facts.stalled_for_s is None)
    )
    if canary_mode == "always" or (canary_mode == "idle" and not busy_and_moving):
        facts.canary, facts.canary_s, facts.canary_detail = canary(
            server, state.model, timeout_s=canary_timeout_s
        )
    return facts


def assess(
    state: GroupState,
    *,
    backend: Backend | None = None,
    canary_mode: str = "idle",
    canary_timeout_s: float = 5.0,
    tracker: ProgressTracker | None = None,
    stall_s: float = 30.0,
    api_key: str | None = None,
    look: Look | None = None,
) -> Assessment:
    """Gather the facts of a deployment and judge them: one look at its nodes (``look``, when
    the caller took it already, as a watch does to keep the nodes' readings) and one at its
    leader.

    The canary runs only when the ranks' processes look right (a request into a group with a
    dead worker would itself crash the leader) and the server is idle or not moving.
    """
    if look is None:
        look = (backend or backend_for(state.backend)).observe(state)
    suspicious = any(
        rank_health(r, look.rank(r.rank), ready=True).state is not RankCondition.HEALTHY
        for r in state.ranks
    )
    api = probe_api(
        state,
        canary_mode="never" if suspicious or not state.ready else canary_mode,
        canary_timeout_s=canary_timeout_s,
        tracker=tracker,
        api_key=api_key or os.environ.get(wire.VLLM_API_KEY),
    )
    return judge(state, look, api, stall_s=stall_s)


@dataclass(frozen=True)
class GroupVerdict:
    """One group of a deployment behind one front door, as the front door's verdict needs it."""

    group: int
    verdict: Verdict
    reason: str = ""
    in_rotation: bool = True
    """The front door sends it requests (vllm-router's membership; on Kubernetes the router
    follows the leaders' readiness, so a group is in rotation when healthy)."""


def of_groups(parts: list[GroupVerdict]) -> tuple[Verdict, str]:
    """The verdict on several groups behind one front door (vLLM's router tandem drives, or a
    LeaderWorkerSet's): healthy when every group is healthy and in rotation; ``degraded``
    while at least one serves; else the worst group's verdict (``down`` when no group is in
    rotation, healthy or not)."""
    serving = [p for p in parts if p.verdict is Verdict.HEALTHY and p.in_rotation]
    if len(serving) == len(parts):
        return Verdict.HEALTHY, ""
    if serving:
        return Verdict.DEGRADED, f"{len(serving)} of {len(parts)} groups serve; " + "; ".join(
            f"group {p.group} {p.verdict.value}{'' if p.in_rotation else ', out of rotation'}"
            + (f": {p.reason}" if p.reason else "")
            for p in parts
            if p not in serving
        )
    worst = max(parts, key=lambda p: p.verdict.exit_code)
    verdict = worst.verdict if worst.verdict is not Verdict.HEALTHY else Verdict.DOWN
    return verdict, "no group serves in the router's rotation"
