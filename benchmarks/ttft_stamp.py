"""What tandem bench's client adds to TTFT, per concurrency, on a server whose TTFT is known.

Starts `benchmarks/reference_server.py` (a vLLM-shaped stream that waits a fixed prefill, then
writes a token every `--gap-ms`, and exports the TTFT it measured itself as vLLM's histogram),
then runs `tandem bench --url` at each concurrency of the ladder, for each client given, rounds
interleaved (client A at c, client B at c, ...). Per run: the client's mean TTFT over the
server's own mean TTFT for the same requests (`tandem bench` differences the server's histogram
per load point); the excess is the client's own cost: the HTTP round trip and the time until it
stamps the first chunk. Reported: the median excess over rounds per client and concurrency.

Two clients compare two versions of tandem side by side in one run, e.g. before and after the
transport stamps a chunk where its bytes arrive (the bench issue's item 8): put the earlier
commit in a worktree and name its `src/` with `--before`.

Usage (an HF home holding `tandem model tiny`, whose tokenizer the server needs):
    git worktree add /tmp/before HEAD~1
    .venv/bin/python benchmarks/ttft_stamp.py --hf-home /tmp/hf --before /tmp/before/src \
        --concurrency 1,4,16,64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def start_server(port: int, hf_home: str, gap_ms: float, prefill_ms: float) -> subprocess.Popen:
    server = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "reference_server.py"),
            "--port",
            str(port),
            "--hf-home",
            hf_home,
            "--gap-ms",
            str(gap_ms),
            "--prefill-ms",
            str(prefill_ms),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the reference server did not start")


def run_bench(src: str, url: str, c: int, args: argparse.Namespace, out: Path) -> dict:
    """One `tandem bench` at concurrency ``c`` with the tandem under ``src``; its load point."""
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "PYTHONPATH": path, "HF_HOME": args.hf_home}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "bench",
            "run",
            "--url",
            url,
            "--model",
            "reference",
            "--endpoint",
            "completions",
            "--concurrency",
            str(c),
            "--requests",
            str(c * args.requests_per_stream),
            "--input-tokens",
            str(args.input_len),
            "--output-tokens",
            str(args.output_len),
            "--warmup",
            "1",
            "--no-plots",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"tandem bench failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    [point] = json.loads((out / "summary.json").read_text())["points"]
    return point


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-home", required=True)
    parser.add_argument("--before", help="src/ of the other tandem (a worktree)")
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-per-stream", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--prefill-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=8300)
    args = parser.parse_args()
    clients = {"this": str(ROOT / "src")}
    if args.before:
        clients = {"before": args.before, **clients}
    ladder = [int(c) for c in args.concurrency.split(",")]
    excess: dict[tuple[str, int], list[float]] = {}
    url = f"http://127.0.0.1:{args.port}"
    server = start_server(args.port, args.hf_home, args.gap_ms, args.prefill_ms)
    try:
        with tempfile.TemporaryDirectory(prefix="ttft-stamp-") as scratch:
            for r in range(args.rounds):
                for c in ladder:
                    for name, src in clients.items():
                        point = run_bench(src, url, c, args, Path(scratch) / f"{name}-{c}-{r}")
                        client = point["metrics"]["ttft_s"]["mean"]
                        served = (point.get("server") or {}).get("ttft_mean_s")
                        if client is None or served is None:
                            raise SystemExit(f"no TTFT at c={c} for {name}: {point}")
                        ms = (client - served) * 1000
                        excess.setdefault((name, c), []).append(ms)
                        print(
                            f"round {r} c={c:<3} {name:7} client {client * 1000:7.2f} ms"
                            f"  server {served * 1000:7.2f} ms  excess {ms:6.2f} ms",
                            flush=True,
                        )
    finally:
        server.terminate()
        server.wait(10)
    print("\nTTFT the client adds over the server's own (median over rounds, ms)")
    print("| concurrency | " + " | ".join(clients) + " |")
    print("|---" * (len(clients) + 1) + "|")
    for c in ladder:
        cells = [f"{statistics.median(excess[(name, c)]):.2f}" for name in clients]
        print(f"| {c} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
