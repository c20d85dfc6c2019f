"""The client of an OpenAI-compatible server (vLLM's API), as every part of tandem talks to it.

Written once here: ``GET /health``, ``GET /v1/models`` with its 401 as ``Unauthorized`` and any
other failure as one ``EndpointError`` that says what to check, picking the one served model
(or checking the named one), a non-streaming chat completion, and reading the reasoning from
either field vLLM has used (the routes and field names themselves are ``tandem.wire``'s).
Readiness, the health model (status, the supervisor, watch) and ``tandem chat`` use the
blocking ``Endpoint``; the bench and the eval the ``AsyncEndpoint`` (httpx's
``Client``/``AsyncClient`` pairing). The bench keeps its own streaming loop
(``tandem.bench.timed_request``) over the client it passes in, with its aiohttp transport.

Usage:
    with Endpoint("http://10.77.0.1:8000", api_key=key) as server:
        model = pick_model(server.models(), None).id    # the only one, or EndpointError
        body = server.chat(model, [{"role": "user", "content": "hi"}], max_tokens=8)

    async with AsyncEndpoint("http://10.77.0.1:8000") as server:
        models = await server.models()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tandem import wire
from tandem.errors import EndpointError, Unauthorized

MODELS_TIMEOUT_S = 10.0


def reasoning_of(message: dict[str, Any]) -> str:
    """The reasoning text of a chat message or stream delta ("" when it has none)."""
    return next((message[k] for k in wire.REASONING_FIELDS if message.get(k)), "")


@dataclass(frozen=True)
class ServedModel:
    """What ``/v1/models`` says about one served model."""

    id: str
    max_model_len: int | None
    root: str | None


def pick_model(models: list[ServedModel], wanted: str | None) -> ServedModel:
    """The named model when the server serves it; with no name, the only one it serves.

    Raises:
        EndpointError: the named model is not served, or no name and not exactly one model.
    """
    names = [m.id for m in models]
    if wanted is None:
        if len(models) != 1:
            raise EndpointError(
                f"the server serves {len(models)} models ({', '.join(names) or 'none'})",
                hint="name one with --model",
            )
        return models[0]
    match = [m for m in models if m.id == wanted]
    if not match:
        raise EndpointError(
            f"the server does not serve '{wanted}' (it serves: {', '.join(names) or 'nothing'})",
            field="model",
            hint="pass one of those names to --model",
        )
    return match[0]


def _served(response: httpx.Response, url: str) -> list[ServedModel]:
    if response.status_code == 401:
        raise Unauthorized(url + wire.MODELS_PATH)
    response.raise_for_status()
    return [
        ServedModel(m["id"], m.get("max_model_len"), m.get("root")) for m in response.json()["data"]
    ]


def _unlisted(url: str, exc: Exception) -> EndpointError:
    return EndpointError(
        f"cannot list models at {url}{wire.MODELS_PATH}: {exc}",
        hint="check that 1. the server is running (`curl URL/health`), 2. the URL is the "
        "server root without /v1, 3. nothing blocks the port",
    )


def _answer(response: httpx.Response, url: str) -> dict[str, Any]:
    if response.status_code == 401:
        raise Unauthorized(url)
    if response.status_code != 200:
        raise EndpointError(f"{url} answered {response.status_code}: {response.text[:300]}")
    try:
        return dict(response.json())
    except ValueError as exc:
        raise EndpointError(f"{url} answered 200 with no JSON: {response.text[:300]}") from exc


def chat_body(model: str, messages: list[dict], params: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming chat completion request."""
    return {"model": model, "messages": messages, "stream": False, **params}


class Endpoint:
    """A blocking client of one server.

    ``client``: an httpx client to share (the health model keeps one per process); else one is
    made with ``api_key`` as a bearer token and ``timeout_s``, and closed with this object.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = wire.bearer(api_key)
        self._own = client is None
        self.client = client or httpx.Client(timeout=timeout_s)

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own:
            self.client.close()

    def _timeout(self, timeout_s: float | None) -> httpx.Timeout | float:
        return self.client.timeout if timeout_s is None else timeout_s

    def health_status(self, *, timeout_s: float | None = None) -> int:
        """The status of ``GET /health``.

        Raises:
            EndpointError: no answer; the message names the route and the transport error.
        """
        try:
            return self.client.get(
                self.url + wire.HEALTH_PATH, headers=self.headers, timeout=self._timeout(timeout_s)
            ).status_code
        except httpx.HTTPError as exc:
            raise EndpointError(
                f"GET {wire.HEALTH_PATH}: {type(exc).__name__} {exc}".strip()
            ) from exc

    def models(self, *, timeout_s: float = MODELS_TIMEOUT_S) -> list[ServedModel]:
        """The models the server serves.

        Raises:
            Unauthorized: the server wants an API key.
            EndpointError: unreachable, or ``/v1/models`` is not an OpenAI list.
        """
        try:
            response = self.client.get(
                self.url + wire.MODELS_PATH, headers=self.headers, timeout=timeout_s
            )
            return _served(response, self.url)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise _unlisted(self.url, exc) from exc

    def chat(
        self, model: str, messages: list[dict], *, timeout_s: float | None = None, **params: Any
    ) -> dict[str, Any]:
        """One non-streaming chat completion; its JSON body.

        Raises:
            Unauthorized: the server wants an API key.
            EndpointError: no answer, or any status but 200.
        """
        try:
            response = self.client.post(
                self.url + wire.CHAT_PATH,
                json=chat_body(model, messages, params),
                headers=self.headers,
                timeout=self._timeout(timeout_s),
            )
        except httpx.HTTPError as exc:
            raise EndpointError(
                f"{self.url} did not answer: {exc}", hint="check `tandem status`"
            ) from exc
        return _answer(response, self.url)


class AsyncEndpoint:
    """The asyncio twin of ``Endpoint``, for the bench and the eval.

    ``client``: an httpx client to share (the bench's, over its aiohttp transport); else one is
    made with ``api_key``, ``timeout`` and ``transport`` (a test's ``httpx.MockTransport``).
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: httpx.Timeout | float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = wire.bearer(api_key)
        self._own = client is None
        self.client = client or httpx.AsyncClient(transport=transport, timeout=timeout)

    async def __aenter__(self) -> AsyncEndpoint:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self.client.aclose()

    async def models(self, *, timeout_s: float = MODELS_TIMEOUT_S) -> list[ServedModel]:
        """The models the server serves (raises as ``Endpoint.models``)."""
        try:
            response = await self.client.get(
                self.url + wire.MODELS_PATH, headers=self.headers, timeout=timeout_s
            )
            return _served(response, self.url)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise _unlisted(self.url, exc) from exc

    async def post_chat(self, body: dict[str, Any]) -> httpx.Response:
        """Send one chat completion request as it is; the caller reads the status (the eval
        retries a 5xx and records a 4xx as an answer).

        Raises:
            httpx.TransportError: no answer (the eval's retry policy decides).
        """
        return await self.client.post(self.url + wire.CHAT_PATH, json=body, headers=self.headers)
