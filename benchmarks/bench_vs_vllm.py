"""tandem bench against `vllm bench serve`: same server, same lengths and concurrency, interleaved.

For every round and every concurrency the two clients run one after the other against the same
server: vLLM's own client (`vllm bench serve`) and `tandem bench`, both with `ignore_eos` and the
same output length. By default they send the same prompts in the same order: a JSONL file of
`--input-len`-token texts (cut with the server's tokenizer) that vLLM reads as its unshuffled
custom dataset and tandem as `--prompt-file`. Each client is a child process; its CPU time
(user + sys, including Python start-up) comes from `os.wait4`.
The CPU each streamed token costs, start-up excluded, is measured apart by
`benchmarks/client_cpu.py` (here vLLM's client start-up, ~10 CPU-s, would swamp it).

The server's speed drifts between runs by more than 5% on a shared 2-core machine, so the
ratios are paired: tandem / vLLM within each round, then the median over rounds. A run in which
the server merged its stream (more than 1.5 tokens per chunk without speculative decoding: the
CPU server's API process fell behind its engine, and TTFT/TPOT then measure that) is reported
and its round left out of the ratios; both clients see it, whichever runs at that moment.

Prints a side-by-side table: median TTFT and TPOT of each client (median over kept rounds of
each run's p50), output tokens/s, the paired ratios tandem / vLLM, and client CPU per output
token twice: all of the child's CPU, and net of its start-up (each round also runs each client
once with one request of one token; its CPU is that client's start-up, subtracted).

Each run also reads the server's own TTFT: vLLM's `vllm:time_to_first_token_seconds`
histogram from /metrics before and after the run (its sum and count, differenced by
`tandem.bench.server_metrics`, as `tandem bench` does per load point: the mean over the run's
requests, from the request's arrival in vLLM's engine client to its first token), and the
scheduler-queue mean beside it. The client's mean TTFT minus the server's is what the client
adds (the HTTP round trip and its own time to notice the chunk); the column says which client is
closer to the server. The server's count includes each client's one warm-up request (tandem's
`--warmup 1`, vLLM's initial test prompt), which the client's mean leaves out: on a warm server
that request costs what the others do; the first request a server ever serves costs seconds, so
read the column from the second run on.

A client can also change what the server measures: at concurrency c, requests that end in one
engine step free their slots together, and a client slow to send the next ones spreads their
arrivals over later steps (more queue time, other prefill batches). "refill p50" is the median
time from a slot freeing (a request's last token chunk) to the client's next request, from each
client's per-request start and end times (vLLM's `--save-detailed`, tandem's requests.jsonl).
To take the engine out of the comparison, run it against `benchmarks/reference_server.py`,
whose TTFT is fixed and known: the server column is then the truth.

The clients are found beside this Python (a venv's `bin/`), else on PATH; `--tandem` and
`--vllm` name other commands (on the GPU machine: `--tandem "python3 -m tandem.cli"`).

Needs pandas in the venv for vLLM's custom dataset (`.venv/bin/pip install pandas`).

Usage:
    .venv/bin/python benchmarks/bench_vs_vllm.py --url http://127.0.0.1:8200 --model tiny-deepseek
    .venv/bin/python benchmarks/bench_vs_vllm.py --start-server --hf-home /tmp/hf  # own server
    python3 benchmarks/bench_vs_vllm.py --url http://127.0.0.1:8000 --model llama-3.1-8b \
        --tandem "python3 -m tandem.cli" --input-len 512 --output-len 256 \
        --concurrency 1,4,16 --requests-per-stream 4   # benchmarks/gpu/session.sh
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tandem.bench.load_generator import REQUESTS_FILE, SUMMARY_FILE, read_records
from tandem.bench.server_metrics import server_delta
from tandem.vllm_metrics import MetricsSnapshot, parse_metrics

BIN = Path(sys.executable).parent


def client_command(name: str, given: str | None) -> list[str]:
    """``given`` split as a shell line, else ``name`` beside this Python, else on PATH."""
    if given:
        return shlex.split(given)
    beside = BIN / name
    return [str(beside) if beside.exists() else shutil.which(name) or name]


@dataclass
class Run:
    client: str
    concurrency: int
    ttft_p50_ms: float
    tpot_p50_ms: float
    itl_p50_ms: float
    output_tokens: int
    cpu_s: float
    wall_s: float
    tokens_per_chunk: float
    input_tokens: int
    output_tok_s: float
    ttft_mean_ms: float = float("nan")
    server_ttft_mean_ms: float = float("nan")
    server_queue_mean_ms: float = float("nan")
    refill_p50_ms: float = float("nan")
    round: int = 0
    startup_cpu_s: float = 0.0

    @property
    def ttft_over_server_ms(self) -> float:
        return self.ttft_mean_ms - self.server_ttft_mean_ms

    @property
    def net_cpu_us_per_token(self) -> float:
        return (self.cpu_s - self.startup_cpu_s) / self.output_tokens * 1e6


def server_snapshot(url: str) -> MetricsSnapshot:
    return parse_metrics(httpx.get(url + "/metrics", timeout=10).text)


def with_server_figures(run_one):
    """Wrap a client run: the server's mean TTFT and queue time over exactly its requests."""

    def wrapped(a, *args, **kwargs) -> Run:
        before = server_snapshot(a.url)
        run = run_one(a, *args, **kwargs)
        delta = server_delta(before, server_snapshot(a.url))
        if delta.ttft_mean_s is not None:
            run.server_ttft_mean_ms = delta.ttft_mean_s * 1000
        if delta.queue_mean_s is not None:
            run.server_queue_mean_ms = delta.queue_mean_s * 1000
        return run

    return wrapped


def refill_p50_ms(starts: list[float], ends: list[float], c: int) -> float:
    """Median time from a slot freeing to the client's next request, at concurrency c.

    With at most c requests in flight, the k-th request sent (k >= c) waits for the (k - c)-th
    to end: its start minus that end (both sorted) is how long the client took to refill the
    slot. An end is the last token chunk, as both clients define it, so this holds the server's
    final chunks too; on one server the difference between clients is the clients'.
    """
    starts, ends = sorted(starts), sorted(ends)
    gaps = [starts[k] - ends[k - c] for k in range(c, len(starts))]
    return statistics.median(gaps) * 1000 if gaps else float("nan")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run cmd as a child; return (user+sys CPU seconds of it and its descendants, wall seconds)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out = proc.stdout.read() if proc.stdout else b""
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        # Cut short (Ctrl-C, or SIGTERM from `timeout`): a client left streaming would load the
        # server under whatever is measured next, so it goes with us.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(out.decode(errors="replace")[-3000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return usage.ru_utime + usage.ru_stime, wall


def same_prompts(a: argparse.Namespace, n: int, path: Path) -> Path:
    """n prompt texts of `--input-len` tokens each, written as `{"prompt": ...}` JSONL: the file
    both clients read, in the same order (vLLM's custom dataset unshuffled, tandem's
    --prompt-file). Lengths are made with the server's own /tokenize and /detokenize."""
    rng = random.Random(a.seed)
    words = [
        "tensor",
        "parallel",
        "rank",
        "leader",
        "worker",
        "cache",
        "decode",
        "prefill",
        "token",
        "stream",
        "node",
        "cable",
        "latency",
        "memory",
        "expert",
        "layer",
    ]

    def tokens(text: str, special: bool) -> list[int]:
        body = {"model": a.model, "prompt": text, "add_special_tokens": special}
        return httpx.post(a.url + "/tokenize", json=body, timeout=30).json()["tokens"]

    # what the server adds to a text prompt (BOS) counts, as in vLLM's random dataset
    added = len(tokens("tensor", True)) - len(tokens("tensor", False))
    lines = []
    for _ in range(n):
        text = " ".join(rng.choice(words) for _ in range(a.input_len * 2))
        ids = tokens(text, False)[: a.input_len - added]
        text = httpx.post(
            a.url + "/detokenize", json={"model": a.model, "tokens": ids}, timeout=30
        ).json()["prompt"]
        lines.append(json.dumps({"prompt": text}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def vllm_cmd(
    a: argparse.Namespace,
    tokenizer: str,
    c: int,
    n: int,
    out_len: int,
    out: Path,
    prompts: Path | None,
) -> list[str]:
    backend = "openai-chat" if a.endpoint == "chat" else "vllm"
    path = "/v1/chat/completions" if a.endpoint == "chat" else "/v1/completions"
    dataset = (
        [
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(prompts),
            "--disable-shuffle",
            "--skip-chat-template",
            "--custom-output-len",
            str(out_len),
        ]
        if prompts
        else [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(a.input_len),
            "--random-output-len",
            str(out_len),
        ]
    )
    return [
        *a.vllm_cmd,
        "bench",
        "serve",
        "--backend",
        backend,
        "--base-url",
        a.url,
        "--endpoint",
        path,
        "--model",
        tokenizer,
        "--served-model-name",
        a.model,
        *dataset,
        "--ignore-eos",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(c),
        "--seed",
        str(a.seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]


def tandem_cmd(
    a: argparse.Namespace, c: int, n: int, out_len: int, out: Path, prompts: Path | None
) -> list[str]:
    dataset = ["--prompt-file", str(prompts)] if prompts else ["--input-tokens", str(a.input_len)]
    return [
        *a.tandem_cmd,
        "bench",
        "--url",
        a.url,
        "--model",
        a.model,
        "--endpoint",
        a.endpoint,
        "--concurrency",
        str(c),
        "--requests",
        str(n),
        *dataset,
        "--output-tokens",
        str(out_len),
        "--seed",
        str(a.seed),
        "--warmup",
        "1",
        "--no-plots",
        "--quiet",
        "--out",
        str(out),
    ]


def vllm_end_times(r: dict) -> list[float]:
    """Each request's last chunk: vLLM 0.32 saves `latencies`; 0.25.1 only the TTFT and the
    gaps, whose sum is the same figure (its latency is the time of the last chunk)."""
    if "latencies" in r:
        return [t + d for t, d in zip(r["start_times"], r["latencies"])]
    return [t + ttft + sum(itl) for t, ttft, itl in zip(r["start_times"], r["ttfts"], r["itls"])]


@with_server_figures
def run_vllm(
    a, tokenizer, c, n, work: Path, env, tag: str, out_len: int, prompts: Path | None
) -> Run:
    out = work / f"vllm-{tag}.json"
    cpu, wall = timed(vllm_cmd(a, tokenizer, c, n, out_len, out, prompts), env)
    r = json.loads(out.read_text())
    chunks = sum(len(itl) + 1 for itl in r["itls"])
    return Run(
        "vllm bench serve",
        c,
        r["median_ttft_ms"],
        r["median_tpot_ms"],
        r["median_itl_ms"],
        int(r["total_output_tokens"]),
        cpu,
        wall,
        int(r["total_output_tokens"]) / chunks,
        int(r["total_input_tokens"]),
        float(r["output_throughput"]),
        float(r["mean_ttft_ms"]),
        refill_p50_ms=refill_p50_ms(r["start_times"], vllm_end_times(r), c),
    )


@with_server_figures
def run_tandem(a, c, n, work: Path, env, tag: str, out_len: int, prompts: Path | None) -> Run:
    out = work / f"tandem-{tag}"
    cpu, wall = timed(tandem_cmd(a, c, n, out_len, out, prompts), env)
    m = json.loads((out / SUMMARY_FILE).read_text())["points"][0]["metrics"]
    records = [r for r in read_records(out / REQUESTS_FILE).records if r.ok]

    def ms(stats: dict) -> float:  # a 1-token probe has no TPOT or ITL
        return stats["p50"] * 1000 if stats["p50"] is not None else float("nan")

    return Run(
        "tandem bench",
        c,
        ms(m["ttft_s"]),
        ms(m["tpot_s"]),
        ms(m["itl_s"]),
        int(m["output_tokens_total"]),
        cpu,
        wall,
        m["tokens_per_chunk"]["mean"],
        int(m["prompt_tokens_total"]),
        float(m["output_throughput_tok_s"] or 0.0),
        m["ttft_s"]["mean"] * 1000 if m["ttft_s"]["mean"] is not None else float("nan"),
        refill_p50_ms=refill_p50_ms(
            [r.start_s for r in records], [r.start_s + (r.e2el_s or 0.0) for r in records], c
        ),
    )


def start_server(a: argparse.Namespace) -> subprocess.Popen:
    hf = Path(a.hf_home)
    subprocess.run([*a.tandem_cmd, "model", "tiny", "--hf-home", str(hf)], check=True)
    env = dict(
        os.environ,
        HF_HOME=str(hf),
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_NO_USAGE_STATS="1",
    )
    port = a.url.rsplit(":", 1)[1]
    proc = subprocess.Popen(
        [
            *a.vllm_cmd,
            "serve",
            "tandem-org/tiny-deepseek-v3",
            "--served-model-name",
            a.model,
            "--host",
            "127.0.0.1",
            "--port",
            port,
            "--max-model-len",
            "1024",
            "--enforce-eager",
            "--generation-config",
            "vllm",
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if httpx.get(a.url + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("the vLLM server exited during start-up")
        time.sleep(2)
    os.killpg(proc.pid, signal.SIGTERM)
    raise SystemExit("the vLLM server did not become healthy in 300 s")


def main() -> None:
    # `timeout` and a device's deadline send SIGTERM: end as Ctrl-C would, through `timed`'s
    # cleanup and the partial table
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8200")
    p.add_argument("--model", default="tiny-deepseek", help="served model name")
    p.add_argument("--tokenizer", help="HF id for vllm's tokenizer; default: /v1/models root")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument(
        "--requests-per-stream",
        type=int,
        default=0,
        help="at concurrency c, send max(--num-prompts, this x c) requests",
    )
    p.add_argument("--tandem", help="tandem command line (default: beside this Python, or PATH)")
    p.add_argument("--vllm", help="vllm command line (default: beside this Python, or PATH)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--prompts",
        choices=["same", "own"],
        default="same",
        help="same: one prompt file both clients read in order (default); own: "
        "each client's random prompts of --input-len tokens",
    )
    p.add_argument(
        "--merged-above",
        type=float,
        default=1.5,
        help="tokens per chunk above which a run counts as merged by the server",
    )
    p.add_argument("--start-server", action="store_true")
    p.add_argument(
        "--skip-startup",
        action="store_true",
        help="no start-up runs (the net CPU column then counts the start-up too)",
    )
    p.add_argument("--hf-home", default=os.environ.get("HF_HOME", "/tmp/bench-work/hf"))
    a = p.parse_args()
    a.url = a.url.rstrip("/")
    a.tandem_cmd = client_command("tandem", a.tandem)
    a.vllm_cmd = client_command("vllm", a.vllm)
    server = start_server(a) if a.start_server else None
    try:
        models = httpx.get(a.url + "/v1/models", timeout=10).json()["data"]
        tokenizer = a.tokenizer or next(m["root"] for m in models if m["id"] == a.model)
        env = dict(
            os.environ,
            HF_HOME=a.hf_home,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
        )
        levels = [int(c) for c in a.concurrency.split(",")]

        def requests(c: int) -> int:
            return max(a.num_prompts, a.requests_per_stream * c)

        runs: list[Run] = []
        finished = False
        try:
            for run in measure(a, levels, requests, tokenizer, env):
                runs.append(run)
                print(run_line(run), flush=True)
            finished = True
        finally:
            if runs:  # what was measured is printed, even when the run is cut short
                print_table(runs, levels, a, finished)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def measure(a, levels: list[int], requests, tokenizer: str, env) -> Iterator[Run]:
    """The interleaved rounds, each run as it ends (a cut run keeps the ones before it)."""
    with tempfile.TemporaryDirectory(prefix="bench-vs-vllm-") as tmp:
        work = Path(tmp)
        prompts = (
            same_prompts(a, max(map(requests, levels)), work / "prompts.jsonl")
            if a.prompts == "same"
            else None
        )
        for r in range(a.rounds):
            startup = (
                {"vllm bench serve": 0.0, "tandem bench": 0.0}
                if a.skip_startup
                else {
                    "vllm bench serve": run_vllm(
                        a, tokenizer, 1, 1, work, env, f"r{r}-startup", 1, prompts
                    ).cpu_s,
                    "tandem bench": run_tandem(
                        a, 1, 1, work, env, f"r{r}-startup", 1, prompts
                    ).cpu_s,
                }
            )
            print(
                f"round {r} start-up CPU (1 request, 1 token): "
                + ", ".join(f"{k} {v:.2f} s" for k, v in startup.items()),
                flush=True,
            )
            for c in levels:
                first_vllm = (r + c) % 2 == 0  # alternate who goes first
                order = ["vllm", "tandem"] if first_vllm else ["tandem", "vllm"]
                for who in order:
                    tag = f"r{r}-c{c}"
                    run = (
                        run_vllm(
                            a,
                            tokenizer,
                            c,
                            requests(c),
                            work,
                            env,
                            tag,
                            a.output_len,
                            prompts,
                        )
                        if who == "vllm"
                        else run_tandem(a, c, requests(c), work, env, tag, a.output_len, prompts)
                    )
                    run.round = r
                    run.startup_cpu_s = startup[run.client]
                    yield run


def run_line(run: Run) -> str:
    """One run's raw figures, the line kept in the results files."""
    return (
        f"round {run.round} c={run.concurrency} {run.client:17s} in {run.input_tokens} tok  "
        f"TTFT {run.ttft_p50_ms:7.2f} ms"
        f"  TPOT {run.tpot_p50_ms:6.2f} ms  out {run.output_tok_s:8.1f} tok/s"
        f"  tok/chunk {run.tokens_per_chunk:5.2f}  CPU {run.cpu_s:5.2f} s  "
        f"net {run.net_cpu_us_per_token:6.1f} us/tok  wall {run.wall_s:5.1f} s"
        f"  TTFT mean {run.ttft_mean_ms:7.2f} ms, server's "
        f"{run.server_ttft_mean_ms:7.2f} ms (queue "
        f"{run.server_queue_mean_ms:6.2f})  refill {run.refill_p50_ms:6.2f} ms"
    )


def print_table(runs: list[Run], levels: list[int], a, finished: bool) -> None:
    print()
    rounds = f"{a.rounds} interleaved rounds"
    if not finished:
        rounds = f"cut short after {len(runs)} runs of {rounds}"
    print(
        f"endpoint {a.endpoint}, {a.input_len} in / {a.output_len} out, "
        f"max({a.num_prompts}, {a.requests_per_stream} x c) requests per run, {rounds}, "
        f"prompts: {a.prompts}"
    )
    head = (
        "| c | client | rounds kept | TTFT p50 ms | TPOT p50 ms | ITL p50 ms | output tok/s "
        "| CPU s | CPU ms/tok | net CPU µs/tok | TTFT mean − server's, ms | server queue ms "
        "| refill p50 ms |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for c in levels:
        pairs = {}
        for run in (r for r in runs if r.concurrency == c):
            pairs.setdefault(run.round, {})[run.client] = run
        kept = {
            rnd: p
            for rnd, p in pairs.items()
            if all(x.tokens_per_chunk <= a.merged_above for x in p.values()) and len(p) == 2
        }
        for rnd, p in sorted(pairs.items()):
            if len(p) < 2:
                print(f"  c={c} round {rnd} left out: only {next(iter(p))} ran before the cut")
            elif rnd not in kept:
                merged = ", ".join(f"{x.client} {x.tokens_per_chunk:.1f}" for x in p.values())
                print(
                    f"  c={c} round {rnd} left out: server merged its stream "
                    f"(tokens per chunk: {merged})"
                )
        if not kept:
            print(f"| {c} | (no round without merged streams) |")
            continue
        for client in ("vllm bench serve", "tandem bench"):
            mine = [p[client] for p in kept.values()]

            def med(key: str, mine: list = mine) -> float:
                return statistics.median(getattr(x, key) for x in mine)

            print(
                f"| {c} | {client} | {len(mine)} | {med('ttft_p50_ms'):.2f} | "
                f"{med('tpot_p50_ms'):.2f} | {med('itl_p50_ms'):.2f} | "
                f"{med('output_tok_s'):.1f} | {med('cpu_s'):.2f} | "
                f"{med('cpu_s') / med('output_tokens') * 1000:.3f} | "
                f"{med('net_cpu_us_per_token'):.1f} | {med('ttft_over_server_ms'):.2f} | "
                f"{med('server_queue_mean_ms'):.2f} | {med('refill_p50_ms'):.2f} |"
            )

        def ratio(key: str, kept: dict = kept) -> float:
            return statistics.median(
                getattr(p["tandem bench"], key) / getattr(p["vllm bench serve"], key)
                for p in kept.values()
            )

        print(
            f"| {c} | paired ratio tandem/vllm | {len(kept)} | {ratio('ttft_p50_ms'):.3f} | "
            f"{ratio('tpot_p50_ms'):.3f} | {ratio('itl_p50_ms'):.3f} | "
            f"{ratio('output_tok_s'):.3f} | {ratio('cpu_s'):.3f} | | "
            f"{ratio('net_cpu_us_per_token'):.3f} | | | |"
        )


if __name__ == "__main__":
    main()
