"""An httpx transport that reads responses with aiohttp, for the load generator's streams.

Why: a benchmark client shares the machine with what it measures, and it must not cost more per
streamed token than the reference client (``vllm bench serve``, which uses aiohttp). httpx's own
transport (httpcore + h11 on anyio) registers and unregisters the socket with the event loop and
runs h11's pure-Python parser for every network read; measured on one SSE chunk per read it costs
about 2.5x the CPU of aiohttp, whose parser is compiled and whose socket is read by a protocol
callback. The rest of tandem, and the load generator's own code, keep httpx's API: requests,
responses, ``httpx.MockTransport`` in tests and httpx's exception classes. This module is the only
place that knows aiohttp.

Why not the kept library for this, ``httpx-aiohttp`` (0.2.0): it costs the same CPU per chunk
(``benchmarks/stream_transport.py``, 8 interleaved rounds of 128-chunk chat streams, client CPU
per 1000 chunks: 0.127 s here, 0.129 s it, 0.291 s httpx's transport at one stream; 0.030 s,
0.032 s and 0.096 s at 32 streams), but it would change what the load generator records: it
raises ``httpx.ConnectTimeout`` for a refused connection and for a server that hangs up before
answering (counted as timeouts, not ``connection`` and ``truncated``), its
``max_connections=None`` leaves aiohttp's limit of 100 connections (a ladder step above 100
would queue in the client), and as a transport it ignores ``HTTP_PROXY``. Fixing that from
outside takes a session factory and a second exception map around it: more code than this.

**When the bytes arrived.** A stream's chunk is stamped where the bytes come off the socket
(aiohttp's protocol, ``data_received``), not when the coroutine waiting for them resumes: at
high concurrency the event loop first runs every other ready stream's callbacks, and the
waiting coroutine's clock read came after all of them (on a server of known TTFT, tandem's
client added 4.7 ms at c = 16, most of it that queue). Each response carries
``ARRIVED_AT`` in its extensions: the arrival time (on the transport's clock) of the first
bytes of the chunk last read, None when the bytes came before the response was handed over
and their time is not known.

aiohttp errors are mapped here to the most specific httpx class, once (the way
``httpx._transports.default.map_httpcore_exceptions`` maps httpcore's), so that callers keep
telling a refused connection (``ConnectError``) from a timeout or a body cut short
(``RemoteProtocolError``).

Usage:
    async with httpx.AsyncClient(transport=AiohttpTransport(max_connections=None)) as client:
        async with client.stream("POST", url, json=payload) as response:
            async for raw in response.aiter_raw():
                ...
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import httpx
from aiohttp.client_proto import ResponseHandler

ARRIVED_AT = "tandem.arrived_at"
"""The response extension: a callable giving the arrival time of the chunk last read."""

# Ordered most specific first: the first entry the error is an instance of wins.
_ERRORS: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
    (aiohttp.ClientProxyConnectionError, httpx.ProxyError),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.ClientOSError, httpx.ReadError),
    (aiohttp.ClientConnectionError, httpx.ReadError),
    (aiohttp.ClientError, httpx.TransportError),
)


@contextlib.contextmanager
def _mapped(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except aiohttp.ClientError as exc:
        for source, target in _ERRORS:
            if isinstance(exc, source):
                raise target(str(exc) or type(exc).__name__, request=request) from exc
        raise


class _ArrivalHandler(ResponseHandler):
    """aiohttp's protocol for one connection, noting when the first body bytes not yet read
    by the response's consumer came off the socket (a read that was only the head does not
    count: vLLM sends the head at once and the first token at the TTFT)."""

    __slots__ = ("_clock", "unread_since")

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float]) -> None:
        super().__init__(loop=loop)
        self._clock = clock
        self.unread_since: float | None = None

    def data_received(self, data: bytes) -> None:
        now = self._clock()
        payload = self._payload
        before = payload.total_bytes if payload is not None else 0
        super().data_received(data)
        if self._payload is not payload:  # these bytes began a response: its head at least
            payload, before = self._payload, 0
        if self.unread_since is None and payload is not None and payload.total_bytes > before:
            self.unread_since = now  # body bytes came with this read

    def take(self) -> float | None:
        """When the bytes just read began to arrive; the next read starts afresh."""
        arrived, self.unread_since = self.unread_since, None
        return arrived


class _Body(httpx.AsyncByteStream):
    """The response body, yielded read by read as the bytes arrive (``iter_any``), each read's
    arrival time kept for ``ARRIVED_AT``."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        request: httpx.Request,
        handler: _ArrivalHandler | None,
    ) -> None:
        self._response = response
        self._request = request
        self._handler = handler
        self.arrived_at: float | None = None

    def arrival(self) -> float | None:
        return self.arrived_at

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped(self._request):
            async for data in self._response.content.iter_any():
                # no await between the read and here: no byte can arrive in between
                handler = self._handler  # (a DataQueue: empty is falsy)
                self.arrived_at = handler.take() if handler is not None else None
                yield data

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx requests sent through one aiohttp session (created on first use, in the loop).

    Args:
        max_connections: open connections at most; None for no limit (a concurrency ladder
            must never queue in the client).
        trust_env: honour ``HTTP_PROXY``/``NO_PROXY`` as httpx does by default.
        clock: what stamps the bytes' arrival (``ARRIVED_AT``); the caller's own clock.

    Timeouts come from each request (httpx's ``timeout`` extension): ``connect`` and ``read``
    apply per socket operation; there is no total, the caller owns that.
    """

    def __init__(
        self,
        max_connections: int | None = None,
        trust_env: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._max_connections = max_connections
        self._trust_env = trust_env
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections or 0, limit_per_host=0)
            # each connection's protocol: aiohttp's own, stamping arrivals (aiohttp builds it
            # with this factory, an attribute of every aiohttp 3 connector)
            connector._factory = functools.partial(  # type: ignore[assignment]
                _ArrivalHandler, loop=asyncio.get_running_loop(), clock=self._clock
            )
            # aiohttp looks the proxy up in the environment again for every request (0.4 ms,
            # a fifth of the client's CPU per streamed chunk at 32 streams), so it is asked to
            # only when a proxy is set; httpx reads the environment once, too.
            proxied = any(scheme != "no" for scheme in urllib.request.getproxies())
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=self._trust_env and proxied,
                auto_decompress=False,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._open()
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        sent = self._clock()
        with _mapped(request):
            response = await session.request(
                request.method,
                # httpx already sent a URL's user:password as the Authorization header;
                # aiohttp refuses a URL that carries them beside it
                str(request.url.copy_with(userinfo=b"")),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                compress=None,
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=timeout.get("connect"), sock_read=timeout.get("read")
                ),
            )
        handler = response.connection.protocol if response.connection else None
        if isinstance(handler, _ArrivalHandler):
            # a kept connection may hold a stamp of the previous response's last bytes
            unread = handler.unread_since
            handler.unread_since = unread if unread is not None and unread >= sent else None
        stream = _Body(response, request, handler if isinstance(handler, _ArrivalHandler) else None)
        extensions: dict[str, object] = {"http_version": b"HTTP/1.1", ARRIVED_AT: stream.arrival}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=stream,
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
