"""tandem bench's context-depth sweep against llama-benchy (PyPI): same server, same depths.

llama-benchy is what DGX Spark owners quote (Spark Arena): prefill speed (pp, tok/s) and decode
speed (tg, tok/s) of one stream at context depths 0 .. 100k, the context sent as a system
message in front of a prompt of pp tokens. `tandem bench --depths` measures the same thing
(per request: prompt tokens / TTFT and 1 / TPOT). For every depth the two clients run one after
the other against the same server, llama-benchy first, so a drift of the server over the run
shows in both columns alike.

llama-benchy reads the model's tokenizer (the server's `/v1/models` root, a snapshot folder on
an offline vLLM) and a book it downloads; no download is possible here, so its cache
(`~/.cache/llama-benchy/MD5(URL).txt`) is seeded with a local text under a `file://` URL
(`--book`, default Debian's GPL-3 text: only its tokens matter). It is run with `--exact-tg`
(`ignore_eos`, as tandem's default) and its own warm-up; tandem with one warm-up request.

Usage (a deployment up, llama-benchy in a venv of its own):
    python3 -m venv /tmp/lb && /tmp/lb/bin/pip install llama-benchy
    .venv/bin/python benchmarks/depth_vs_llama_benchy.py --url http://10.77.0.1:8000 \\
        --model tiny-deepseek --llama-benchy /tmp/lb/bin/llama-benchy --depths 0,256,512

Prints, per depth: each client's mean pp and tg over its runs, the ratio tandem / llama-benchy,
and the prompt tokens each sent (server-counted for tandem; llama-benchy's own count). Within
5 % is the goal; llama-benchy subtracts one measured round trip (`/v1/models`) from its time to
first response, which on a local server is under a millisecond.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import httpx

from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import LoadGenerator
from tandem.bench.workload import synthetic_text

DEFAULT_BOOK = Path("/usr/share/common-licenses/GPL-3")


def seed_book(book: Path) -> str:
    """Put ``book`` where llama-benchy looks for its downloaded text; the URL that finds it."""
    url = f"file://{book.resolve()}" if book.exists() else "file:///tandem-synthetic-book"
    text = book.read_text() if book.exists() else synthetic_text(0, 60_000)
    cache = Path.home() / ".cache" / "llama-benchy"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"{hashlib.md5(url.encode()).hexdigest()}.txt").write_text(text)
    return url


def model_root(url: str, model: str, key: str | None) -> str:
    """The served model's folder (`root` of /v1/models): its tokenizer, for llama-benchy."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    models = httpx.get(f"{url}/v1/models", headers=headers, timeout=10).json()["data"]
    return next(m["root"] for m in models if m["id"] == model)


def llama_benchy(a: argparse.Namespace, depth: int, book_url: str, work: Path) -> dict:
    """One llama-benchy run at one depth; its mean pp and tg and the prompt tokens."""
    out = work / f"llama-benchy-d{depth}.json"
    argv = [
        *shlex.split(a.llama_benchy),
        "--base-url", f"{a.url}/v1",
        "--model", a.model,
        "--served-model-name", a.model,
        "--tokenizer", a.tokenizer,
        "--pp", str(a.pp),
        "--tg", str(a.tg),
        "--depth", str(depth),
        "--runs", str(a.runs),
        "--exact-tg",
        "--skip-coherence",
        "--book-url", book_url,
        "--format", "json",
        "--save-result", str(out),
    ]  # fmt: skip
    if a.api_key:
        argv += ["--api-key", a.api_key]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode or not out.exists():
        raise SystemExit(f"llama-benchy failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    (run,) = [r for r in json.loads(out.read_text())["benchmarks"] if r["context_size"] == depth]
    return {
        "pp": run["pp_throughput"]["mean"],
        "tg": run["tg_throughput"]["mean"],
        "ttfr_ms": run["ttfr"]["mean"],
    }


def tandem(a: argparse.Namespace, depth: int, work: Path) -> dict:
    """One tandem bench point at one depth; its mean pp and tg and prompt tokens."""
    config = BenchConfig(
        url=a.url,
        model=a.model,
        api_key=a.api_key,
        input_tokens=a.pp,
        output_tokens=a.tg,
        depths=[depth],
        seed=depth,  # one run a depth: the same seed would draw each shallower context again
        concurrency=[1],
        requests=a.runs,
        warmup_requests=1,
        kv_sample_interval_s=0,
    )
    result = asyncio.run(LoadGenerator(config, work / f"tandem-d{depth}").arun())
    m = result.points[0].metrics
    return {
        "pp": m.prefill_tok_s.mean,
        "tg": m.decode_tok_s.mean,
        "ttft_ms": m.ttft_s.mean * 1000 if m.ttft_s.mean else None,
        "prompt_tokens": m.prompt_tokens.mean,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server root, e.g. http://10.77.0.1:8000")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--llama-benchy", default="llama-benchy", help="its command line")
    p.add_argument("--tokenizer", help="folder with tokenizer.json; default: /v1/models root")
    p.add_argument("--depths", default="0,256,512")
    p.add_argument("--pp", type=int, default=128, help="prompt tokens after the context")
    p.add_argument("--tg", type=int, default=32, help="tokens generated")
    p.add_argument("--runs", type=int, default=3, help="requests per depth, each client")
    p.add_argument("--book", type=Path, default=DEFAULT_BOOK, help="llama-benchy's corpus")
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args()
    a.url = a.url.rstrip("/").removesuffix("/v1")
    a.tokenizer = a.tokenizer or model_root(a.url, a.model, a.api_key)
    book_url = seed_book(a.book)
    rows = []
    with tempfile.TemporaryDirectory(prefix="depth-vs-llama-benchy-") as folder:
        for depth in (int(d) for d in a.depths.split(",")):
            theirs = llama_benchy(a, depth, book_url, Path(folder))
            ours = tandem(a, depth, Path(folder))
            rows.append({"depth": depth, "llama_benchy": theirs, "tandem": ours})
            print(f"depth {depth}: llama-benchy {theirs}, tandem {ours}", flush=True)
    print()
    print("| depth | prompt tok (tandem) | pp llama-benchy | pp tandem | ratio | "
          "tg llama-benchy | tg tandem | ratio |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        theirs, ours = row["llama_benchy"], row["tandem"]
        print(
            f"| {row['depth']} | {ours['prompt_tokens']:.0f} | {theirs['pp']:.1f} | "
            f"{ours['pp']:.1f} | {ours['pp'] / theirs['pp']:.3f} | {theirs['tg']:.2f} | "
            f"{ours['tg']:.2f} | {ours['tg'] / theirs['tg']:.3f} |"
        )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
