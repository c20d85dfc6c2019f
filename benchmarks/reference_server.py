"""A server whose true TTFT is known: the instrument for "which client measures TTFT nearer it".

`bench_vs_vllm.py` puts tandem bench beside `vllm bench serve` on one vLLM server, and on the
GPU tandem's TTFT came out 15-31 % lower. Against a real engine, though, the server's TTFT
itself moves with how the requests arrive (which ones share a prefill step), so a gap between
the clients can be the server's as much as theirs. This server takes the engine out: it answers
`POST /v1/completions` the way vLLM streams (one `text_completion` chunk per token, the last with
`finish_reason: "length"`, a usage chunk, `data: [DONE]`), waits a fixed `--prefill-ms` after
reading a request before the first token and `--gap-ms` between tokens, whatever the load, and
exports what it measured itself as vLLM does: `vllm:time_to_first_token_seconds` (sum, count;
from the request body read to the first token's write), `vllm:prompt_tokens_total` and
`vllm:generation_tokens_total`. Each client's TTFT minus the server's is then that client's own
overhead, at GPU-like token rates (5 ms gaps: 16 streams make 3,200 chunks/s), on any machine.

It also serves what the two clients ask before they start: `/v1/models` (the model, its
tokenizer as `root`, `max_model_len`), `/health`, `/version`, and `/tokenize` and
`/detokenize` with the tiny model's tokenizer (`tandem model tiny`), which `bench_vs_vllm.py`
uses to cut its prompts and `vllm bench serve` loads to count them. Its event loop is uvloop's,
as vLLM's API server's is.

Usage (the HF home holding `tandem model tiny`'s snapshot):
    .venv/bin/python benchmarks/reference_server.py --port 8300 --hf-home /tmp/hf &
    HF_HOME=/tmp/hf .venv/bin/python benchmarks/bench_vs_vllm.py --url http://127.0.0.1:8300 \
        --model reference --hf-home /tmp/hf --input-len 512 --output-len 256 \
        --concurrency 1,4,16 --requests-per-stream 4 --rounds 3 --skip-startup
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import uvloop
from aiohttp import web
from tokenizers import Tokenizer

from tandem.plan.config import hf_cache_snapshot

REPO = "tandem-org/tiny-deepseek-v3"


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chunk(model: str, text: str, finish: str | None = None) -> dict:
    return {
        "id": "cmpl-reference",
        "object": "text_completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }


class Reference:
    """The server's state: its tokenizer, its timings and what it has counted."""

    def __init__(self, model: str, hf_home: Path, prefill_s: float, gap_s: float) -> None:
        snapshot = hf_cache_snapshot(REPO, "main", [hf_home])
        if snapshot is None:
            raise SystemExit(f"no {REPO} under {hf_home}: run `tandem model tiny --hf-home ...`")
        self.tokenizer = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
        self.model, self.prefill_s, self.gap_s = model, prefill_s, gap_s
        self.ttft_sum = 0.0
        self.ttft_count = self.prompt_tokens = self.generation_tokens = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        arrived = time.perf_counter()
        prompt = body.get("prompt") or ""
        prompt_ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt).ids
        tokens = int(body.get("max_tokens") or 16)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(self.prefill_s)
        for i in range(tokens):
            if i:
                await asyncio.sleep(self.gap_s)
            await response.write(
                sse(chunk(self.model, " x", "length" if i == tokens - 1 else None))
            )
            if i == 0:
                self.ttft_sum += time.perf_counter() - arrived
                self.ttft_count += 1
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": tokens,
            "total_tokens": len(prompt_ids) + tokens,
        }
        self.prompt_tokens += len(prompt_ids)
        self.generation_tokens += tokens
        await response.write(sse({**chunk(self.model, ""), "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        labels = f'{{engine="0",model_name="{self.model}"}}'
        text = "\n".join(
            [
                "# TYPE vllm:time_to_first_token_seconds histogram",
                f"vllm:time_to_first_token_seconds_sum{labels} {self.ttft_sum}",
                f"vllm:time_to_first_token_seconds_count{labels} {float(self.ttft_count)}",
                "# TYPE vllm:prompt_tokens counter",
                f"vllm:prompt_tokens_total{labels} {float(self.prompt_tokens)}",
                "# TYPE vllm:generation_tokens counter",
                f"vllm:generation_tokens_total{labels} {float(self.generation_tokens)}",
            ]
        )
        return web.Response(text=text + "\n", content_type="text/plain")

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "root": REPO, "max_model_len": 4096}
        return web.json_response({"object": "list", "data": [card]})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()  # vLLM's default: special tokens added, as completions does
        ids = self.tokenizer.encode(
            body["prompt"], add_special_tokens=body.get("add_special_tokens", True)
        )
        return web.json_response({"tokens": ids.ids, "count": len(ids.ids), "max_model_len": 4096})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "reference"})

    async def detokenize(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"prompt": self.tokenizer.decode((await request.json())["tokens"])}
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--model", default="reference", help="the served model name")
    p.add_argument("--hf-home", default=os.environ.get("HF_HOME", "/tmp/bench-work/hf"))
    p.add_argument("--prefill-ms", type=float, default=12.0, help="first token after this")
    p.add_argument("--gap-ms", type=float, default=5.0, help="between tokens")
    a = p.parse_args()
    ref = Reference(a.model, Path(a.hf_home), a.prefill_ms / 1000, a.gap_ms / 1000)
    app = web.Application()
    app.router.add_post("/v1/completions", ref.completions)
    app.router.add_get("/v1/models", ref.models)
    app.router.add_get("/metrics", ref.metrics)
    app.router.add_post("/tokenize", ref.tokenize)
    app.router.add_post("/detokenize", ref.detokenize)
    app.router.add_get("/health", ref.health)
    app.router.add_get("/version", ref.version)
    web.run_app(
        app,
        host="127.0.0.1",
        port=a.port,
        print=None,
        backlog=512,
        access_log=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
