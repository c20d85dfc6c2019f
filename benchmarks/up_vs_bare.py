"""`tandem up` against the same ranks started bare: ready time, cold and warm, side by side.

The bare side is what a user does by hand: the ranks' exact commands (taken from
``tandem render --format json`` before any clock starts, so both sides run the same argv and
variables), each started at once with ``ip netns exec NODE`` in namespaces built the way tandem
builds them (also before the clock), then a loop that posts a 1-token chat completion to the
leader every 0.25 s. Ready is the first 200. The tandem side is the wall time of ``tandem up``
(preflight, network, launch, readiness: /health, /v1/models and a real chat completion), then
``tandem status --json`` for its phases.

Cold and warm mean the compile caches: each side has its own per-rank cache root (the
variables of ``tandem.caches.CACHE_DIRS``), emptied before a cold start and kept for a warm one
(``tandem down --purge-caches`` / ``tandem down``). A round is four starts, bare cold, tandem
cold, tandem warm, bare warm, with the order of the sides swapped every other round; every
start waits first for the GPU memory (``nvidia-smi``, where present) to be free. The ratio is
paired within a round: tandem / bare.

Results are written as they come (``--out``/starts.jsonl, with each start's rank logs), and a
start already in ``--state``/starts.jsonl is skipped, so a later call goes on where a
``--deadline`` stopped one. Run as root (namespaces):

    python3 benchmarks/up_vs_bare.py --recipe examples/recipes/gpu-llama8b.yaml \\
        --cluster examples/gpu-cluster-1gpu.yaml --tandem "python3 -m tandem.cli" \\
        --out $OUT/up --state /root/up --rounds 1 --deadline 500     # on the GPU machine
    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/up_vs_bare.py \\
        --recipe tiny-local --cluster examples/local-netns.yaml --out /tmp/up --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tandem import caches
from tandem.agent import Node
from tandem.backends import netns
from tandem.backends.state import DeploymentDir
from tandem.spec.cluster import LocalIsolation
from tandem.spec.loading import load_cluster
from tandem.vllm_log import BootLog
from tandem.watch.gpu import parse_nvidia_smi


def run(cmd: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def gpu_memory_free(limit_s: float = 90.0) -> None:
    """Wait until the GPUs hold less than 1 GiB (the last start's processes are gone), read
    as `tandem watch` reads them; no wait where there is no nvidia-smi."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        gpus = parse_nvidia_smi(Node().run("nvidia-smi-watch"))
        if sum(g.memory_used_bytes or 0 for g in gpus) < 1 << 30:
            return
        time.sleep(0.5)


def log_figures(log: Path) -> dict:
    """Compile cache state, engine init and torch.compile seconds of one rank's log, read by
    tandem's ``BootLog``: the same reading for both sides."""
    boot = BootLog(rank=0)
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        boot.feed(line)
    return boot.figures.model_dump(include={"compile_s", "engine_init_s", "compile_cache"})


class Bare:
    """The rendered ranks, started by hand in the same kind of namespaces."""

    def __init__(self, opts: argparse.Namespace, env: dict[str, str]) -> None:
        rendered = run(
            [
                *opts.tandem_cmd,
                "render",
                opts.recipe,
                "--cluster",
                opts.cluster,
                "--format",
                "json",
            ],
            env,
        )
        if rendered.returncode:
            raise SystemExit(f"tandem render failed:\n{rendered.stderr}")
        self.spec = json.loads(rendered.stdout)
        self.name = self.spec["deployment"]
        cluster = load_cluster(Path(opts.cluster))
        self.network = (
            netns.network_plan(f"bare-{self.name}"[:20], cluster)
            if cluster.local.isolation is not LocalIsolation.LOOPBACK and os.geteuid() == 0
            else None
        )
        self.caches = opts.work / "bare-caches"
        self.env = env
        self.limit_s = opts.limit

    def start(self, cold: bool, logs: Path) -> dict:
        if cold:
            shutil.rmtree(self.caches, ignore_errors=True)
        logs.mkdir(parents=True, exist_ok=True)
        if self.network:
            netns.sweep_orphans()  # what a killed earlier run left
            netns.create(self.network, purpose="bare ranks of benchmarks/up_vs_bare.py")
        ranks = sorted(self.spec["ranks"], key=lambda r: r["start_order"])
        commands = []
        for rank in ranks:
            argv = list(rank["argv"])  # vllm on PATH, else beside this Python (a venv)
            argv[0] = shutil.which(argv[0]) or str(Path(sys.executable).parent / argv[0])
            if self.network:
                argv = ["ip", "netns", "exec", self.network.netns_of(rank["node"]), *argv]
            env = dict(self.env)
            env |= caches.cache_env(self.caches / f"rank{rank['rank']}")
            env |= rank["env"]
            commands.append((rank["rank"], argv, env))
        (logs / "commands.txt").write_text(
            "".join(f"rank{r}: {shlex.join(argv)}\n" for r, argv, _ in commands)
        )
        url = self.spec["endpoint"].rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
        body = {
            "model": self.spec["model"],
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
        }
        procs = []
        started = time.monotonic()
        for rank, argv, env in commands:
            with (logs / f"rank{rank}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        argv,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        ready_s, error = None, None
        try:
            with httpx.Client(timeout=10, trust_env=False) as client:
                while time.monotonic() - started < self.limit_s:
                    try:
                        if client.post(url, json=body).status_code == 200:
                            ready_s = time.monotonic() - started
                            break
                    except httpx.HTTPError:
                        pass
                    if any(p.poll() is not None for p in procs):
                        error = "a rank exited"
                        break
                    time.sleep(0.25)
                else:
                    error = "not ready in time"
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            if self.network:
                netns.destroy(self.network)
        leader = next(r["rank"] for r in ranks if r["role"] == "leader")
        return {
            "ready_s": ready_s,
            "error": error,
            **log_figures(logs / f"rank{leader}.log"),
        }


class Tandem:
    """``tandem up`` / ``status`` / ``down`` of the recipe, timed from outside."""

    def __init__(self, opts: argparse.Namespace, env: dict[str, str], name: str) -> None:
        self.opts, self.env, self.name = opts, env, name

    def cli(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return run([*self.opts.tandem_cmd, *args], self.env, timeout)

    def start(self, cold: bool, logs: Path) -> dict:
        self.cli("down", self.name, *(["--purge-caches"] if cold else []))
        started = time.monotonic()
        result = self.cli("up", self.opts.recipe, "--cluster", self.opts.cluster)
        wall = time.monotonic() - started
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "up.txt").write_text(result.stdout + result.stderr)
        for log in DeploymentDir.of(self.name).rank_logs():
            shutil.copy(log, logs / log.name)
        figures: dict = {"ready_s": wall if result.returncode == 0 else None}
        if result.returncode:
            figures["error"] = f"tandem up exited {result.returncode}: {result.stderr[-400:]}"
        else:
            status = json.loads(self.cli("status", self.name, "--json").stdout)
            figures |= {
                "error": None,
                "answered_s": status["phases"][-1]["elapsed_s"],
                **log_figures(logs / "rank0.log"),
            }
        self.cli("down", self.name)
        return figures


def plan_of_round(i: int) -> list[tuple[str, str]]:
    """(side, cold|warm) in start order; the sides swap every other round."""
    first, second = ("bare", "tandem") if i % 2 == 0 else ("tandem", "bare")
    return [(first, "cold"), (second, "cold"), (second, "warm"), (first, "warm")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--out", type=Path, required=True, help="results and rank logs")
    p.add_argument("--state", type=Path, help="kept between calls (default: --out)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--deadline", type=float, default=1e9, help="seconds this call may use")
    p.add_argument("--expect", type=float, default=120, help="seconds one start needs")
    p.add_argument("--limit", type=float, default=900, help="seconds one bare start may take")
    p.add_argument("--tandem", help="tandem command line (default: python -m tandem.cli)")
    opts = p.parse_args()
    began = time.monotonic()
    opts.tandem_cmd = (
        shlex.split(opts.tandem) if opts.tandem else [sys.executable, "-m", "tandem.cli"]
    )
    opts.state = opts.state or opts.out
    opts.work = opts.state / "work"
    for folder in (opts.out, opts.state, opts.work):
        folder.mkdir(parents=True, exist_ok=True)
    os.environ["TANDEM_HOME"] = str(opts.work / "home")  # DeploymentDir reads it here too
    env = dict(os.environ)
    bare = Bare(opts, env)
    sides = {"bare": bare, "tandem": Tandem(opts, env, bare.name)}
    record = opts.state / "starts.jsonl"
    done = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    for i in range(opts.rounds):
        for side, kind in plan_of_round(i):
            tag = f"r{i}-{side}-{kind}"
            if any(d["tag"] == tag for d in done):
                continue
            if opts.deadline - (time.monotonic() - began) < opts.expect:
                print(f"DEFER {tag}: the call's deadline is near", flush=True)
                continue
            gpu_memory_free()
            figures = sides[side].start(kind == "cold", opts.state / tag)
            row = {"tag": tag, "round": i, "side": side, "kind": kind, **figures}
            done.append(row)
            with record.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print("START " + json.dumps(row), flush=True)
    if opts.out != opts.state:
        shutil.copytree(opts.state, opts.out, dirs_exist_ok=True, ignore=lambda d, n: ["work"])
    print_table(done)
    return 0


def print_table(rows: list[dict]) -> None:
    print(
        "\n| round | start | bare ready s | tandem ready s | tandem / bare | "
        "compile s bare / tandem | engine init s bare / tandem | cache bare / tandem |"
    )
    print("|---|---|---:|---:|---:|---|---|---|")
    ratios: dict[str, list[float]] = {"cold": [], "warm": []}
    for i in sorted({r["round"] for r in rows}):
        for kind in ("cold", "warm"):
            got = {r["side"]: r for r in rows if r["round"] == i and r["kind"] == kind}
            if len(got) < 2:
                continue
            b, t = got["bare"], got["tandem"]
            ratio = t["ready_s"] / b["ready_s"] if t["ready_s"] and b["ready_s"] else None
            if ratio:
                ratios[kind].append(ratio)

            def f(x: float | None) -> str:
                return "—" if x is None else f"{x:.1f}"

            print(
                f"| {i} | {kind} | {f(b['ready_s'])} | {f(t['ready_s'])} | "
                f"{'—' if ratio is None else f'{ratio:.3f}'} | "
                f"{f(b.get('compile_s'))} / {f(t.get('compile_s'))} | "
                f"{f(b.get('engine_init_s'))} / {f(t.get('engine_init_s'))} | "
                f"{b.get('compile_cache')} / {t.get('compile_cache')} |"
            )
    for kind, values in ratios.items():
        if values:
            print(
                f"median tandem / bare, {kind}: {statistics.median(values):.3f} "
                f"over {len(values)} round(s)"
            )


if __name__ == "__main__":
    sys.exit(main())
