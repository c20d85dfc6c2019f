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

import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import httpx

from tandem import wire
from tandem.backends.state import BootFigures, PhaseMark
from tandem.errors import RankFailed


class Phase(StrEnum):
    """Start-up phases in the order a healthy deployment reaches them."""

    LAUNCHED = "launched"
    RENDEZVOUS = "rendezvous"
    WEIGHTS_LOADED = "weights loaded"
    COMPILED = "compiled"
    KV_CACHE = "kv cache sized"
    GRAPHS = "graphs captured"
    API_SERVER = "api server up"
    PORT_OPEN = "port open"
    HEALTHY = "health 200"
    MODEL_LISTED = "model listed"
    ANSWERED = "answered"


# vLLM's own log lines, as the CPU and GPU builds print them.
_RENDEZVOUS = re.compile(r"world_size=(\d+) rank=(\d+)")
_WEIGHTS = re.compile(r"(?:Model loading took|Loading weights took) ([\d.]+) (GiB|seconds)")
_AVAILABLE_KV = re.compile(
    r"Available KV cache memory: ([\d.]+) GiB|Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache"
)
_COMPILED = re.compile(r"torch\.compile took ([\d.]+) s in total")
_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_GRAPHS = re.compile(
    r"Graph capturing finished|CUDA graph capture took|Capturing CUDA graphs.*100%"
)
_COMPILE_WARM = re.compile(
    r"Directly load AOT compilation from path|"
    r"Directly load the compiled graph\(s\)"
)
_COMPILE_RELOAD_FAILED = re.compile(
    r"Compiling model again due to a load failure from \S+, "
    r"reason: (.*)$"
)
_COMPILE_COLD = re.compile(r"saved AOT compiled function to|Compiling a graph for compile range")
_ENGINE_INIT = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took "
    r"([\d.]+) s"
)
_API = re.compile(r"Starting vLLM (?:API )?server|Uvicorn running on|Application startup complete")
_ERROR_LINE = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception|Timeout)\b:.*)$")


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass
class BootLog:
    """Phases and memory figures found in one rank's log lines (pure; feed it lines)."""

    rank: int
    phases: list[tuple[Phase, str]] = field(default_factory=list)
    figures: BootFigures = field(default_factory=BootFigures)

    def feed(self, line: str) -> list[tuple[Phase, str]]:
        """Read one line; return the phases it marks (each reported once per rank)."""
        found: list[tuple[Phase, str]] = []
        if m := _RENDEZVOUS.search(line):
            self.figures.world_size = int(m.group(1))
            found.append((Phase.RENDEZVOUS, f"world_size={m.group(1)} rank={m.group(2)}"))
        if m := _WEIGHTS.search(line):
            found.append((Phase.WEIGHTS_LOADED, f"{m.group(1)} {m.group(2)}"))
        if m := _COMPILED.search(line):
            found.append((Phase.COMPILED, f"{m.group(1)} s"))
        if m := _AVAILABLE_KV.search(line):
            self.figures.available_kv_cache_gib = float(m.group(1) or m.group(2))
        if m := _KV_TOKENS.search(line):
            self.figures.kv_cache_tokens = _number(m.group(1))
            found.append((Phase.KV_CACHE, f"{m.group(1)} tokens"))
        if m := _CONCURRENCY.search(line):
            self.figures.max_concurrency_tokens_per_request = _number(m.group(1))
            self.figures.max_concurrency = float(m.group(2))
        if m := _COMPILE_RELOAD_FAILED.search(line):
            self.figures.compile_cache = self.figures.compile_cache or "recompiled"
            found.append(
                (
                    Phase.COMPILED,
                    f"recompiled: vLLM could not load its compile cache "
                    f"({m.group(1).strip()}); kernel caches reused",
                )
            )
        elif _COMPILE_WARM.search(line) or _COMPILE_COLD.search(line):
            state = "warm" if _COMPILE_WARM.search(line) else "cold"
            self.figures.compile_cache = self.figures.compile_cache or state
            found.append(
                (
                    Phase.COMPILED,
                    "warm: loaded from the compile cache"
                    if state == "warm"
                    else "cold: compiled, saved to the compile cache",
                )
            )
        if m := _ENGINE_INIT.search(line):
            self.figures.engine_init_s = float(m.group(1))
        if _GRAPHS.search(line):
            found.append((Phase.GRAPHS, ""))
        if _API.search(line):
            found.append((Phase.API_SERVER, ""))
        seen = {p for p, _ in self.phases}
        fresh = [(p, d) for p, d in found if p not in seen]
        self.phases += fresh
        return fresh


# Known start-up failures: a pattern of the cause line, and the fix a user needs.
KNOWN_CAUSES: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"LocalEntryNotFoundError|Cannot find an appropriate cached snapshot"),
        "the model is not in this node's Hugging Face cache and offline mode forbids a download: "
        "put the snapshot in HF_HOME on every node (`tandem model tiny` for the tiny model, "
        "`hf download REPO` for others) or set model.offline: false",
    ),
    (
        re.compile(r"Gloo connectFullMesh failed|remote=\[127\.0\.0\.1\]"),
        "Gloo bound to the wrong interface: pin network.control_plane.interface (or the node's "
        "control_plane_interface) to the NIC the nodes share",
    ),
    (
        re.compile(r"Available memory on node .* less than desired CPU memory"),
        "set VLLM_CPU_KVCACHE_SPACE (GiB of KV cache per worker) in the recipe's env",
    ),
    (
        re.compile(r"less than desired GPU memory utilization"),
        "lower engine.serve.gpu_memory_utilization, or free device memory (stop the desktop: "
        "`systemctl stop display-manager`; drop page cache)",
    ),
    (
        re.compile(r"local_world_size \(\d+\) must be less than or equal"),
        "use engine.executor: mp; Ray cannot place a TP group on one-GPU nodes",
    ),
    (
        re.compile(r"cannot import name 'b12x_"),
        "remove VLLM_USE_B12X_MHC / _WO_PROJECTION / _FP8_GEMM from env; "
        "keep only VLLM_USE_B12X_MOE",
    ),
    (
        re.compile(r"Address already in use"),
        "another process holds the API or master port on that node: stop it or change ports",
    ),
    (
        re.compile(r"NCCL error: invalid usage"),
        "two ranks of one NCCL group on one GPU of one host: give each node its own NCCL_HOSTID "
        "(node env) so NCCL treats them as two hosts, or give each rank its own GPU",
    ),
    (
        re.compile(r"No module named 'flashinfer'"),
        "flashinfer is not installed: set VLLM_USE_FLASHINFER_SAMPLER: 0 in the recipe's env "
        "(PyTorch's top-k/top-p sampler), or install flashinfer-python",
    ),
    (
        re.compile(r"longer than 107 characters"),
        "TMPDIR is too long for vLLM's IPC sockets: point TMPDIR at a short path",
    ),
]


def known_fix(cause: str) -> str | None:
    """The fix for a recognised start-up failure, or None."""
    return next((fix for pattern, fix in KNOWN_CAUSES if pattern.search(cause)), None)


def failure_cause(log_text: str) -> str:
    """The most telling line of a failed rank's log: the last exception or error line."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line or "Timeout" in line:
            if m := _ERROR_LINE.search(line):
                return m.group(1)[:400]
            return line[:400]
    return lines[-1][:400] if lines else "the log is empty"


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

    def boot() -> BootFigures:
        return logs[leader].figures

    reached: set[Phase] = set()
    url = urlparse(endpoint)
    headers = wire.bearer(api_key)
    with httpx.Client(base_url=endpoint, timeout=10.0, headers=headers) as client:
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
            if Phase.PORT_OPEN not in reached and _port_open(url.hostname or "", url.port or 80):
                reached.add(Phase.PORT_OPEN)
                mark(Phase.PORT_OPEN, leader)
            if (
                Phase.PORT_OPEN in reached
                and Phase.HEALTHY not in reached
                and _get_ok(client, "/health")
            ):
                reached.add(Phase.HEALTHY)
                mark(Phase.HEALTHY, leader)
            if (
                Phase.HEALTHY in reached
                and Phase.MODEL_LISTED not in reached
                and _lists_model(client, model)
            ):
                reached.add(Phase.MODEL_LISTED)
                mark(Phase.MODEL_LISTED, leader, model)
            if Phase.MODEL_LISTED in reached:
                answer = _try_completion(client, model, request_timeout_s)
                if answer is not None:
                    text, tokens = answer
                    mark(Phase.ANSWERED, leader, f"{tokens} tokens")
                    read_logs()
                    return Readiness(
                        phases=marks, boot=boot(), answer=text, completion_tokens=tokens
                    )
            sleep(poll_s)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _get_ok(client: httpx.Client, path: str) -> bool:
    try:
        return client.get(path).status_code == 200
    except httpx.HTTPError:
        return False


def _lists_model(client: httpx.Client, model: str) -> bool:
    try:
        response = client.get("/v1/models")
        return response.status_code == 200 and any(
            m.get("id") == model for m in response.json().get("data", [])
        )
    except (httpx.HTTPError, ValueError):
        return False


def _try_completion(client: httpx.Client, model: str, timeout_s: float) -> tuple[str, int] | None:
    """One short real completion; None while the engine cannot answer yet."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    try:
        response = client.post("/v1/chat/completions", json=body, timeout=timeout_s)
        if response.status_code != 200:
            return None
        data = response.json()
        text = data["choices"][0]["message"].get("content") or ""
        return text, int(data.get("usage", {}).get("completion_tokens", 0))
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None
