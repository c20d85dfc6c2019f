"""The client of an OpenAI-compatible server (vLLM's API), as every part of tandem talks to it.

Written once here: ``GET /health``, ``GET /v1/models`` with its 401 as ``Unauthorized`` and any
other failure as one ``EndpointError`` that says what to check, picking the one served model
(or checking the named one), a chat completion (whole, streamed, or with its refusal as an
answer), vLLM's ``/tokenize`` and ``/metrics``, and reading the reasoning from either field
vLLM has used (the routes and field names themselves are ``tandem.wire``'s).

Every answer is read into its typed model here, once (``answer_of``: ``ChatCompletion``,
``ChatChunk``, ``Tokens``, ``ModelList``): a body that is not JSON, a list, or an object of
another shape (``"choices": "x"``, a message that is a string) becomes an ``EndpointError``
naming the route and what came back, which every caller already turns into a message or a
verdict, never a traceback. The models keep the fields they do not name (``extra``), so a
caller reads what the server sent, checked. Readiness, the health model (status, the
supervisor, watch), ``tandem chat`` and the smoke checks use the blocking ``Endpoint``; the
bench and the eval the ``AsyncEndpoint`` (httpx's ``Client``/``AsyncClient`` pairing). The
bench keeps its own streaming loop (``tandem.bench.timed_request``) over the client it passes
in, with its aiohttp transport.

Usage:
    with Endpoint("http://10.77.0.1:8000", api_key=key) as server:
        model = pick_model(server.models(), None).id    # the only one, or EndpointError
        body = server.chat(model, [{"role": "user", "content": "hi"}], max_tokens=8)

    async with AsyncEndpoint("http://10.77.0.1:8000") as server:
        models = await server.models()
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem import wire
from tandem.errors import EndpointError, Unauthorized

MODELS_TIMEOUT_S = 10.0


class _Answer(BaseModel):
    """A part of a server's answer: the fields tandem reads, typed; the rest kept as sent."""

    model_config = ConfigDict(extra="allow")


class ToolFunction(_Answer):
    name: str | None = None
    arguments: str | None = Field(default=None, description="The arguments as JSON text.")


class ToolCall(_Answer):
    id: str | None = None
    type: str | None = None
    function: ToolFunction | None = None


class ChatMessage(_Answer):
    """A message, or a stream's delta."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(_Answer):
    token: str | None = None
    logprob: float


class TokenLogprob(_Answer):
    token: str | None = None
    logprob: float | None = None
    top_logprobs: list[TopLogprob] | None = None


class Logprobs(_Answer):
    content: list[TokenLogprob] | None = None


class ChatChoice(_Answer):
    index: int | None = None
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: Logprobs | None = None


class Usage(_Answer):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    completion_tokens_details: dict[str, Any] | None = None


class ChatCompletion(_Answer):
    """``POST /v1/chat/completions``, not streamed: at least one choice."""

    choices: list[ChatChoice] = Field(min_length=1)
    usage: Usage | None = None


class ChunkChoice(_Answer):
    """A choice of a stream's event: a chat's ``delta``, or a completion's ``text``."""

    index: int | None = None
    delta: ChatMessage | None = None
    text: str | None = None
    finish_reason: str | None = None
    logprobs: Logprobs | None = None


class ChatChunk(_Answer):
    """One ``data:`` event of a streamed chat completion."""

    choices: list[ChunkChoice] = Field(default_factory=list)
    usage: Usage | None = None


class Tokens(_Answer):
    """vLLM's ``POST /tokenize``."""

    tokens: list[int]
    count: int | None = None


class Detokenized(_Answer):
    """vLLM's ``POST /detokenize``."""

    prompt: str


class ModelCard(_Answer):
    id: str
    max_model_len: int | None = None
    root: str | None = None


class ModelList(_Answer):
    """``GET /v1/models``."""

    data: list[ModelCard]


A = TypeVar("A", bound=BaseModel)


def answer_of(model: type[A], response: httpx.Response, what: str) -> A:
    """The body of ``response`` read as ``model``.

    Raises:
        EndpointError: the body is not JSON, or not the object ``model`` describes; the
            message names the request (``what``: ``POST /tokenize``), the status, the first
            thing wrong and the start of the body.
    """
    return parse_answer(model, response.text, f"{what} answered {response.status_code}")


def parse_answer(model: type[A], text: str, said: str) -> A:
    """``text`` (an answer's body, or one event of a stream) read as ``model``; ``said``
    introduces it in an error (``POST /tokenize answered 200``).

    Raises:
        EndpointError: as ``answer_of``.
    """
    try:
        data = json.loads(text)
    except ValueError:
        raise EndpointError(f"{said} with a body that is not JSON: {text[:200]!r}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        what = f"{where}: {first['msg']}" if where else f"a JSON {_json_kind(data)}"
        raise EndpointError(
            f"{said} with a body that is not a {model.__name__} object ({what}): {text[:200]!r}",
            hint="is the URL an OpenAI-compatible server (vLLM), not a proxy's or another "
            "program's page?",
        ) from None


def _json_kind(data: object) -> str:
    kinds = {list: "list", str: "string", bool: "true or false", type(None): "null"}
    return kinds.get(type(data), "number" if isinstance(data, int | float) else "object")


def chunk_problem(chunk: object) -> str | None:
    """What keeps one parsed event of a stream (chat or completions) from being a chunk, None
    when it is one; for the bench's own stream loop, which reads the event as it came."""
    try:
        ChatChunk.model_validate(chunk)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc']) or 'the event'}: {first['msg']}"
    return None


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
    listed = answer_of(ModelList, response, f"GET {url}{wire.MODELS_PATH}")
    return [ServedModel(m.id, m.max_model_len, m.root) for m in listed.data]


def _unlisted(url: str, exc: Exception) -> EndpointError:
    return EndpointError(
        f"cannot list models at {url}{wire.MODELS_PATH}: {exc}",
        hint="check that 1. the server is running (`curl URL/health`), 2. the URL is the "
        "server root without /v1, 3. nothing blocks the port",
    )


def _answer(response: httpx.Response, url: str, path: str) -> dict[str, Any]:
    """A chat completion's body, checked to be one (the callers read it as the server sent
    it)."""
    if response.status_code == 401:
        raise Unauthorized(url)
    if response.status_code != 200:
        raise EndpointError(f"{url}{path} answered {response.status_code}: {response.text[:300]}")
    return _as_sent(answer_of(ChatCompletion, response, f"POST {url}{path}"))


def _as_sent(answer: BaseModel) -> dict[str, Any]:
    """An answer read through its model, as the JSON object the server sent (checked)."""
    return answer.model_dump(mode="json", exclude_unset=True)


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
                f"{self.url} did not answer: {_said(exc)}", hint="check `tandem status`"
            ) from exc
        return _answer(response, self.url, wire.CHAT_PATH)

    def chat_answer(
        self, model: str, messages: list[dict], **params: Any
    ) -> tuple[int, dict[str, Any]]:
        """One chat completion whose refusal is an answer too (a 400 for a flag the server
        lacks): its status and body; a refusal's body as sent, or ``{"error": TEXT}``.

        Raises:
            EndpointError: no answer, or a 200 whose body is not a chat completion.
        """
        response = self._send("POST", wire.CHAT_PATH, chat_body(model, messages, params))
        if response.status_code == 200:
            return 200, _answer(response, self.url, wire.CHAT_PATH)
        try:
            body = response.json()
        except ValueError:
            body = None
        return response.status_code, body if isinstance(body, dict) else {
            "error": response.text[:300]
        }

    def stream_chat(self, model: str, messages: list[dict], **params: Any) -> list[dict[str, Any]]:
        """A streamed chat completion's events, each checked to be a chunk.

        Raises:
            EndpointError: no answer, another status than 200, or an event that is not a chunk.
        """
        body = chat_body(model, messages, params) | {"stream": True}
        try:
            with self.client.stream(
                "POST", self.url + wire.CHAT_PATH, json=body, headers=self.headers
            ) as response:
                if response.status_code != 200:
                    raise EndpointError(
                        f"{self.url}{wire.CHAT_PATH} streamed answered {response.status_code}: "
                        f"{response.read().decode(errors='replace')[:300]}"
                    )
                return list(self._events(response))
        except httpx.HTTPError as exc:
            raise EndpointError(f"{self.url}{wire.CHAT_PATH} did not answer: {_said(exc)}") from exc

    def _events(self, response: httpx.Response) -> Iterator[dict[str, Any]]:
        said = f"a streamed POST {self.url}{wire.CHAT_PATH} answered an event"
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield _as_sent(parse_answer(ChatChunk, line[6:], said))

    def tokenize(self, body: dict[str, Any]) -> list[int]:
        """vLLM's ``POST /tokenize`` of ``body`` (a ``prompt`` or chat ``messages``).

        Raises:
            EndpointError: no answer, another status than 200, or no list of token ids.
        """
        response = self._send("POST", wire.TOKENIZE_PATH, body)
        if response.status_code != 200:
            raise EndpointError(
                f"{self.url}{wire.TOKENIZE_PATH} answered {response.status_code}: "
                f"{response.text[:300]}"
            )
        return answer_of(Tokens, response, f"POST {self.url}{wire.TOKENIZE_PATH}").tokens

    def metrics_text(self) -> str | None:
        """The ``/metrics`` page as text; None when the server has none (another status).

        Raises:
            EndpointError: no answer.
        """
        response = self._send("GET", wire.METRICS_PATH)
        return response.text if response.status_code == 200 else None

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        try:
            return self.client.request(method, self.url + path, json=body, headers=self.headers)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{self.url}{path} did not answer: {_said(exc)}") from exc


def _said(exc: httpx.HTTPError) -> str:
    """A transport error in words: httpx's timeouts have no text of their own."""
    return str(exc) or type(exc).__name__


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
