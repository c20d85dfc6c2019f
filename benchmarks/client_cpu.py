"""Client CPU per streamed token: tandem bench's request path against vLLM's, on one SSE server.

On a real server the two clients' start-up (about 10 CPU-seconds for `vllm bench serve`) hides
what matters on a shared machine: the CPU each streamed token costs the client. This script
isolates it. A small SSE server (its own process) streams vLLM-shaped completion chunks, one
token per network write, `--gap-ms` apart; each client runs in its own process and reports
`getrusage` CPU over the measured requests only (imports, start-up and one warm-up request
excluded):

- `vllm`: `async_request_openai_completions` from the installed vLLM's benchmark library, on
  the `aiohttp.ClientSession` that `vllm bench serve` builds, on asyncio's loop (as it runs);
- `tandem`: `tandem.bench.timed_request.send_request` through the aiohttp transport on uvloop, as
  `tandem bench` runs it;
- `tandem-httpcore`: the same code on httpx's default transport and asyncio's loop (what
  tandem bench used before the transport was changed), for reference.

Rounds are interleaved; the table gives the median µs per token and the ratio to vLLM.

Usage:
    .venv/bin/python benchmarks/client_cpu.py --rounds 5 --requests 64 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time

EVENT = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny",'
    b'"choices":[{"index":0,"text":" load","logprobs":null,"finish_reason":null,'
    b'"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n'
)


# --- the server ------------------------------------------------------------------------------


async def serve(port: int, gap_s: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            body = json.loads(await reader.readexactly(length))
            tokens = int(body.get("max_tokens") or 16)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            for _ in range(tokens):
                writer.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
                await writer.drain()
                await asyncio.sleep(gap_s)
            tail = (
                b'data: {"id":"cmpl-1","object":"text_completion","created":1,'
                b'"model":"tiny","choices":[],"usage":{"prompt_tokens":8,'
                b'"total_tokens":%d,"completion_tokens":%d}}\n\ndata: [DONE]\n\n'
                % (tokens + 8, tokens)
            )
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=512)
    async with server:
        await server.serve_forever()


# --- the clients -----------------------------------------------------------------------------


async def measure(one, requests: int, concurrency: int) -> dict:
    await one(0)  # warm-up: connection, first-use code paths
    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int) -> int:
        async with gate:
            return await one(i)

    before = resource.getrusage(resource.RUSAGE_SELF)
    tokens = await asyncio.gather(*(gated(i) for i in range(requests)))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "tokens": sum(tokens)}


async def vllm_client(url: str, a: argparse.Namespace) -> dict:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_completions,
    )

    connector = aiohttp.TCPConnector(
        limit=a.concurrency,
        limit_per_host=a.concurrency,
        ttl_dns_cache=300,
        use_dns_cache=True,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
        force_close=False,
        ssl=False,
    )
    async with aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)
    ) as session:

        async def one(i: int) -> int:
            out = await async_request_openai_completions(
                RequestFuncInput(
                    prompt=[1, 2, 3, 4, 5, 6, 7, 8],
                    api_url=url + "/v1/completions",
                    prompt_len=8,
                    output_len=a.tokens,
                    model="tiny",
                    ignore_eos=True,
                ),
                session,
            )
            assert out.success, out.error
            return out.output_tokens

        return await measure(one, a.requests, a.concurrency)


async def tandem_client(url: str, a: argparse.Namespace, transport) -> dict:
    import httpx

    from tandem.bench.timed_request import ENDPOINTS, Prompt, RequestSlot, Sampling, send_request

    endpoint = ENDPOINTS["completions"]
    payload = endpoint.payload("tiny", Prompt("", tuple(range(1, 9))), Sampling(a.tokens))
    timeout = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None)
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:

        async def one(i: int) -> int:
            record = await send_request(
                client, url, endpoint, payload, RequestSlot(i, "c", 0.0), origin=0.0, timeout_s=600
            )
            assert record.ok, record.error_detail
            return record.output_tokens or 0

        return await measure(one, a.requests, a.concurrency)


def run_client(a: argparse.Namespace) -> dict:
    url = f"http://127.0.0.1:{a.port}"
    if a.client == "vllm":
        return asyncio.run(vllm_client(url, a))
    if a.client == "tandem-httpcore":
        import httpx

        transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None))
        return asyncio.run(tandem_client(url, a, transport))
    import uvloop

    from tandem.bench.aiohttp_transport import AiohttpTransport

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(tandem_client(url, a, AiohttpTransport()))


# --- the comparison ----------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    p.add_argument("--gap-ms", type=float, default=2.0, help="time between two tokens")
    p.add_argument("--port", type=int, default=8931)
    p.add_argument("--clients", default="vllm,tandem,tandem-httpcore")
    p.add_argument("--client", help=argparse.SUPPRESS)  # internal: run one client and print
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        asyncio.run(serve(a.port, a.gap_ms / 1000))
        return
    if a.client:
        print(json.dumps(run_client(a)))
        return

    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--port", str(a.port), "--gap-ms", str(a.gap_ms)]
    )
    time.sleep(1.0)
    clients = a.clients.split(",")
    per_token: dict[str, list[float]] = {c: [] for c in clients}
    try:
        for r in range(a.rounds):
            order = clients[r % len(clients) :] + clients[: r % len(clients)]
            for client in order:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--client",
                        client,
                        "--port",
                        str(a.port),
                        "--requests",
                        str(a.requests),
                        "--concurrency",
                        str(a.concurrency),
                        "--tokens",
                        str(a.tokens),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=dict(os.environ, VLLM_NO_USAGE_STATS="1"),
                )
                m = json.loads(out.stdout.strip().splitlines()[-1])
                us = m["cpu_s"] / m["tokens"] * 1e6
                per_token[client].append(us)
                print(
                    f"round {r} {client:16s} {m['tokens']} tokens  {m['cpu_s']:.3f} CPU s  "
                    f"{us:.1f} µs/token",
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait()
    print()
    print(
        f"{a.requests} requests × {a.tokens} tokens, concurrency {a.concurrency}, one token per "
        f"write every {a.gap_ms:g} ms; median over {a.rounds} interleaved rounds"
    )
    print("| client | CPU µs per token | ratio to vLLM |")
    print("|---|---|---|")
    ref = statistics.median(per_token["vllm"]) if "vllm" in per_token else None
    for client in clients:
        med = statistics.median(per_token[client])
        ratio = f"{med / ref:.2f}" if ref else ""
        print(f"| {client} | {med:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
