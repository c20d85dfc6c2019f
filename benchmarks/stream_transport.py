"""Client CPU per streamed chunk for each httpx transport over aiohttp, and how each reports faults.

Issue 18 asks whether the kept library ``httpx-aiohttp`` can replace tandem's own
``AiohttpTransport`` (``tandem.bench.aiohttp_transport``): only if it is as cheap per streamed
chunk and keeps the error classes ``tandem.bench.timed_request.send_request`` sorts failures
by. This script measures both in one run.

The server (its own process, aiohttp's web server) answers ``POST /v1/chat/completions`` the way
vLLM's chat stream does: HTTP/1.1 chunked ``text/event-stream``, a first chunk with the
assistant role, then one content chunk per token (``data: {"object":"chat.completion.chunk",
... "delta":{"content":" load"}}`` + blank line, about 200 bytes), each its own
``StreamResponse.write`` ``--gap-ms`` apart, then the finish chunk, the usage chunk and
``data: [DONE]``; ``max_tokens`` of the request sets the number of content chunks.

The client (this process, on uvloop as ``tandem bench`` runs) streams the same requests through
four clients and reads the body as the load generator does (every read as it arrives, counting
SSE events), without decoding it, so that only the transport differs:

- ``ours``: ``tandem.bench.aiohttp_transport.AiohttpTransport(max_connections=None)``;
- ``httpx-aiohttp``: ``httpx_aiohttp.AiohttpTransport(limits=httpx.Limits(max_connections=None))``;
- ``httpx``: httpx's default transport (httpcore + h11), for reference;
- ``aiohttp``: a plain ``aiohttp.ClientSession`` and ``iter_any``, the floor.

Each cell (one client at one concurrency) opens its client, sends one warm-up request, then
``--requests`` requests at that concurrency; its figure is ``time.process_time()`` over those
requests per 1000 SSE chunks received, and its wall time. Rounds run every cell, the clients in
a new order each round (ABCD, DCBA, BCDA, ADCB, ...), so neither drift on a shared machine nor
what the previous cell left behind (garbage, closing connections) falls on one client.
Printed: the median per cell over the rounds, its ratio to ``ours``, and reads per chunk (1.0:
each chunk arrived in its own read, the shape vLLM's decode loop gives).

Then the faults, through ``send_request`` with each httpx transport, against a small socket
server: nothing listening, a server that hangs up before answering, a body cut short, a stream
that stalls; and 150 streams at once (does the transport queue behind a connection limit?).
Each prints the category tandem records and the httpx class behind it.

It needs ``httpx-aiohttp``, which tandem does not depend on (``pip install httpx-aiohttp``);
the figures and the decision are in ``tandem.bench.aiohttp_transport``'s docstring.

Usage:
    .venv/bin/python benchmarks/stream_transport.py
    .venv/bin/python benchmarks/stream_transport.py --concurrency 1,32 --chunks 128 --gap-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import httpx_aiohttp
import uvloop
from aiohttp import web

from tandem.bench.aiohttp_transport import AiohttpTransport
from tandem.bench.timed_request import ENDPOINTS, Prompt, RequestSlot, Sampling, send_request

CLIENTS = ("ours", "httpx-aiohttp", "httpx", "aiohttp")
PATH = "/v1/chat/completions"


# --- the server ------------------------------------------------------------------------------


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chat_chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "tiny",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


ROLE = sse(chat_chunk({"role": "assistant", "content": ""}))
TOKEN = sse(chat_chunk({"content": " load"}))
FINISH = sse(chat_chunk({}, finish="length"))


def serve(port: int, gap_s: float) -> None:
    async def chat(request: web.Request) -> web.StreamResponse:
        chunks = int((await request.json()).get("max_tokens") or 16)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(ROLE)
        for _ in range(chunks):
            await asyncio.sleep(gap_s)
            await response.write(TOKEN)
        usage = {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": chunks + 8}
        await response.write(FINISH)
        await response.write(sse({**chat_chunk({}), "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post(PATH, chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=512, access_log=None)


# --- the clients -----------------------------------------------------------------------------


def httpx_client(name: str) -> httpx.AsyncClient:
    transport: httpx.AsyncBaseTransport
    if name == "ours":
        transport = AiohttpTransport(max_connections=None)
    elif name == "httpx-aiohttp":
        transport = httpx_aiohttp.AiohttpTransport(limits=httpx.Limits(max_connections=None))
    else:
        transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None))
    timeout = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None)  # the bench's
    return httpx.AsyncClient(transport=transport, timeout=timeout)


Stream = Callable[[], Awaitable[tuple[int, int]]]  # one request -> (chunks, reads)


@contextlib.asynccontextmanager
async def opened(name: str, url: str, payload: dict):
    """A function that streams one request through client ``name``."""
    if name == "aiohttp":
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:

            async def one_aiohttp() -> tuple[int, int]:
                chunks = reads = 0
                async with session.post(url, json=payload) as response:
                    async for data in response.content.iter_any():
                        chunks += data.count(b"\n\n")
                        reads += 1
                return chunks, reads

            yield one_aiohttp
        return
    async with httpx_client(name) as client:

        async def one_httpx() -> tuple[int, int]:
            chunks = reads = 0
            async with client.stream("POST", url, json=payload) as response:
                async for data in response.aiter_raw():
                    chunks += data.count(b"\n\n")
                    reads += 1
            return chunks, reads

        yield one_httpx


async def cell(name: str, url: str, a: argparse.Namespace, concurrency: int) -> dict:
    payload = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    payload["max_tokens"] = a.chunks
    async with opened(name, url, payload) as one:
        await one()  # warm-up: the connection, first-use code paths
        gate = asyncio.Semaphore(concurrency)

        async def gated() -> tuple[int, int]:
            async with gate:
                return await one()

        cpu, wall = time.process_time(), time.perf_counter()
        done = await asyncio.gather(*(gated() for _ in range(a.requests * concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    chunks = sum(c for c, _ in done)
    return {"cpu_s": cpu, "wall_s": wall, "chunks": chunks, "reads": sum(r for _, r in done)}


# --- the faults ------------------------------------------------------------------------------

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))


async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.close()


async def cut_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(SSE_HEAD + http_chunk(ROLE + TOKEN))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()


async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(SSE_HEAD + http_chunk(ROLE + TOKEN))
    await writer.drain()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(5)


FAULTS = {
    "nothing listening": None,
    "hangs up before answering": hang_up,
    "body cut short": cut_body,
    "stalls (0.5 s read timeout)": stall,
}
EXPECTED = {
    "nothing listening": "connection",
    "hangs up before answering": "truncated",
    "body cut short": "truncated",
    "stalls (0.5 s read timeout)": "timeout",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def fault(name: str, handler) -> str:
    server = await asyncio.start_server(handler, "127.0.0.1", 0) if handler else None
    port = server.sockets[0].getsockname()[1] if server else free_port()
    endpoint = ENDPOINTS["chat"]
    payload = endpoint.payload("tiny", Prompt("hi"), Sampling(max_tokens=8))
    try:
        async with httpx_client(name) as client:
            client.timeout = httpx.Timeout(5.0, read=0.5)
            record = await send_request(
                client,
                f"http://127.0.0.1:{port}",
                endpoint,
                payload,
                RequestSlot(0, "fault", 0.0),
                origin=0.0,
                timeout_s=5.0,
            )
    finally:
        if server:
            server.close()
    detail = (record.error_detail or "").split(":")[0]
    return f"{record.error.value if record.error else 'ok'} ({detail})"


async def most_open(name: str, streams: int = 150) -> int:
    """How many of ``streams`` concurrent requests the server sees open at once."""
    open_now, most = 0, 0
    all_open = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, most
        await read_request(reader)
        open_now += 1
        most = max(most, open_now)
        if open_now == streams:
            all_open.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_open.wait(), 1.0)
        writer.write(SSE_HEAD + http_chunk(TOKEN + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        writer.close()
        open_now -= 1

    server = await asyncio.start_server(answer, "127.0.0.1", 0, backlog=256)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{PATH}"
    async with httpx_client(name) as client:
        await asyncio.gather(*(client.post(url, json={}) for _ in range(streams)))
    server.close()
    return most


async def faults() -> None:
    names = CLIENTS[:3]
    print("| fault | expected | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 2) + "|")
    for fault_name, handler in FAULTS.items():
        got = [await fault(n, handler) for n in names]
        print(f"| {fault_name} | {EXPECTED[fault_name]} | " + " | ".join(got) + " |")
    opened_at_once = [str(await most_open(n)) for n in names]
    print("| 150 streams: open at once | 150 | " + " | ".join(opened_at_once) + " |")


# --- the comparison --------------------------------------------------------------------------


async def compare(a: argparse.Namespace) -> None:
    url = f"http://127.0.0.1:{a.port}{PATH}"
    levels = [int(c) for c in a.concurrency.split(",")]
    clients = a.clients.split(",")
    cells: dict[tuple[int, str], list[dict]] = {(c, n): [] for c in levels for n in clients}
    for r in range(a.rounds):
        order = clients[r // 2 % len(clients) :] + clients[: r // 2 % len(clients)]
        order = order[::-1] if r % 2 else order
        for c in levels:
            for name in order:
                gc.collect()  # the last cell's garbage is not this one's CPU
                await asyncio.sleep(0.2)  # nor are its connections closing on the server
                m = await cell(name, url, a, c)
                cells[c, name].append(m)
                print(
                    f"round {r} c={c:<3d} {name:14s} {m['chunks']:6d} chunks "
                    f"{m['cpu_s']:6.3f} CPU s {m['wall_s']:6.2f} s wall "
                    f"{m['cpu_s'] / m['chunks'] * 1000:.4f} CPU s/1000 chunks",
                    flush=True,
                )
    print()
    print(
        f"{a.requests}×concurrency requests × {a.chunks} chunks, one chunk per write every "
        f"{a.gap_ms:g} ms; median over {a.rounds} interleaved rounds; client on uvloop"
    )
    print("| concurrency | client | CPU s per 1000 chunks | ratio to ours | wall s | reads/chunk |")
    print("|---|---|---|---|---|---|")
    for c in levels:
        ours = statistics.median(m["cpu_s"] / m["chunks"] * 1000 for m in cells[c, "ours"])
        for name in clients:
            ms = cells[c, name]
            per_k = statistics.median(m["cpu_s"] / m["chunks"] * 1000 for m in ms)
            wall = statistics.median(m["wall_s"] for m in ms)
            reads = statistics.median(m["reads"] / m["chunks"] for m in ms)
            print(f"| {c} | {name} | {per_k:.4f} | {per_k / ours:.2f} | {wall:.2f} | {reads:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--requests", type=int, default=8, help="requests per unit of concurrency")
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--chunks", type=int, default=128, help="content chunks per response")
    p.add_argument("--gap-ms", type=float, default=2.0, help="time between two chunks")
    p.add_argument("--port", type=int, default=8932)
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--no-faults", action="store_true", help="skip the fault table")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # internal
    a = p.parse_args()
    if a.serve:
        serve(a.port, a.gap_ms / 1000)
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--port", str(a.port), "--gap-ms", str(a.gap_ms)]
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", a.port)):
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the SSE server did not start")
            time.sleep(0.1)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(compare(a))
            if not a.no_faults:
                print()
                runner.run(faults())
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
