"""Readiness that means the model answers, and the start-up phases read from the ranks' logs.

``/health`` answering 200 proves little: vLLM's API server answers it while a worker node is
dead or the engine is still waiting at the rendezvous. A deployment is ready here only after
four checks pass in order: the leader's port accepts a connection, ``/health`` is 200,
``/v1/models`` lists the served model, and one real chat completion returns tokens.

While waiting, every rank's log is read as it grows, and the phases vLLM goes through are
reported with the time since launch: rendezvous (world size and rank), weights loaded, compiled
(``warm`` when vLLM loaded its compiled graphs from the cache, ``cold`` when it compiled them,
``recompiled`` when it found them but could not load them),
KV cache sized (with the figures the planner is checked against), graphs captured, API server
up. A rank
that exits, or a timeout, stops the wait with the cause taken from the logs.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from tandem.endpoint import Endpoint
from tandem.errors import EndpointError, RankFailed
from tandem.vllm_log import BootFigures, BootLog, Phase, PhaseMark, failure_cause, known_fix


class WatchedRank(Protocol):
    """What readiness needs from a launched rank: its number, its log, whether it exited."""

    rank: int

    def new_lines(self) -> list[str]:
        """Log lines appended since the last call."""

    def recent_text(self) -> str:
        """The end of the rank's log, to find the cause of a failure in."""

    def exit_code(self) -> int | None:
        """None while running, else the exit status."""


class LogTail:
    """Reads only what was appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("r", errors="replace") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
                self.offset = handle.tell()
        except FileNotFoundError:
            return []
        text = self.partial + chunk
        lines = text.split("\n")
        self.partial = lines.pop()
        return lines


@dataclass
class Readiness:
    """The outcome of a successful wait."""

    phases: list[PhaseMark]
    boot: BootFigures
    answer: str
    completion_tokens: int


def wait_ready(
    endpoint: str,
    model: str,
    ranks: Sequence[WatchedRank],
    *,
    timeout_s: float,
    request_timeout_s: float = 120.0,
    on_phase: Callable[[PhaseMark], None] = lambda mark: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 1.0,
    api_key: str | None = None,
) -> Readiness:
    """Wait until the deployment answers a real chat completion.

    Args:
        endpoint: the leader's base URL, e.g. ``http://10.77.0.1:8000``.
        model: the served model name.
        ranks: the launched ranks, leader included.
        timeout_s: from now until giving up.
        on_phase: called once for every phase reached, for live display.
        api_key: sent as a bearer token when the server requires one (VLLM_API_KEY).

    Raises:
        RankFailed: a rank exited, or time ran out; the message carries the cause from the log.
    """
    start = clock()
    marks: list[PhaseMark] = []
    logs = {r.rank: BootLog(r.rank) for r in ranks}
    leader = min(r.rank for r in ranks)

    def mark(phase: Phase, rank: int | None = None, detail: str = "") -> None:
        pm = PhaseMark(
            phase=phase.value, elapsed_s=round(clock() - start, 2), rank=rank, detail=detail
        )
        marks.append(pm)
        on_phase(pm)

    def read_logs() -> None:
        for r in ranks:
            for line in r.new_lines():
                for phase, detail in logs[r.rank].feed(line):
                    mark(phase, r.rank, detail)

    reached: set[Phase] = set()
    url = urlparse(endpoint)
    with Endpoint(endpoint, api_key=api_key, timeout_s=10.0) as server:
        checks: tuple[tuple[Phase, Callable[[], bool], str], ...] = (
            (Phase.PORT_OPEN, lambda: _port_open(url.hostname or "", url.port or 80), ""),
            (Phase.HEALTHY, lambda: _health_ok(server), ""),
            (Phase.MODEL_LISTED, lambda: _lists_model(server, model), model),
        )
        while True:
            read_logs()
            for r in ranks:
                code = r.exit_code()
                if code is not None:
                    read_logs()
                    cause = failure_cause(r.recent_text())
                    see = f"see the whole log with `tandem logs --rank {r.rank}`"
                    fix = known_fix(cause)
                    raise RankFailed(
                        f"exited with status {code} during start-up: {cause}",
                        rank=r.rank,
                        hint=f"{fix}; {see}" if fix else see,
                    )
            if clock() - start > timeout_s:
                last = marks[-1].phase if marks else Phase.LAUNCHED.value
                causes = "; ".join(
                    f"rank {r.rank}: {failure_cause(r.recent_text())}" for r in ranks
                )
                raise RankFailed(
                    f"not ready after {timeout_s:.0f} s (last phase: {last}); {causes}",
                    hint="raise timeouts.startup_s if the logs show progress, else read "
                    "`tandem logs` for a rank stuck at the rendezvous",
                )
            for phase, passes, detail in checks:  # each only once the one before it passed
                if phase in reached:
                    continue
                if not passes():
                    break
                reached.add(phase)
                mark(phase, leader, detail)
            if Phase.MODEL_LISTED in reached:
                answer = _try_completion(server, model, request_timeout_s)
                if answer is not None:
                    text, tokens = answer
                    mark(Phase.ANSWERED, leader, f"{tokens} tokens")
                    read_logs()
                    return Readiness(
                        phases=marks,
                        boot=logs[leader].figures,
                        answer=text,
                        completion_tokens=tokens,
                    )
            sleep(poll_s)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _health_ok(server: Endpoint) -> bool:
    try:
        return server.health_status() == 200
    except EndpointError:
        return False


def _lists_model(server: Endpoint, model: str) -> bool:
    try:
        return any(m.id == model for m in server.models())
    except EndpointError:
        return False


def _try_completion(server: Endpoint, model: str, timeout_s: float) -> tuple[str, int] | None:
    """One short real completion; None while the engine cannot answer yet."""
    messages = [{"role": "user", "content": "Say hello."}]
    try:
        data = server.chat(model, messages, timeout_s=timeout_s, max_tokens=8, temperature=0)
        text = data["choices"][0]["message"].get("content") or ""
        return text, int(data.get("usage", {}).get("completion_tokens", 0))
    except (EndpointError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
