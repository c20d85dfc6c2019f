"""Streaming requests to an OpenAI-compatible server, timed once for every endpoint kind.

The timing loop is written once (``send_request``); what differs between
``/v1/chat/completions`` and ``/v1/completions`` is only the payload and how a choice becomes
text, and that is the ``Endpoint`` protocol (registry: ``ENDPOINTS``). A network read is stamped
with the time its bytes arrived, which the transport notes where they come off the socket
(``aiohttp_transport.ARRIVED_AT``), or else when the read returns; before any JSON is parsed.
The clock is injected (``clock``, the transport's too), so tests can replay a recorded stream
with chosen arrival times through ``StreamAccumulator``.

A failed request is data, not an exception: ``send_request`` always returns a
``RequestRecord``, with an ``ErrorCategory`` when it failed. httpx exceptions are mapped to
categories here, once, and never leave this module.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

import httpx

from tandem import wire
from tandem.bench.aiohttp_transport import ARRIVED_AT
from tandem.bench.records import ErrorCategory, RequestRecord
from tandem.endpoint import Detokenized, Tokens, answer_of, chunk_problem, reasoning_of
from tandem.errors import EndpointError

Clock = Callable[[], float]
"""Seconds from an arbitrary origin, monotonic; ``time.perf_counter`` unless a test injects one."""

_DETAIL_CHARS = 300


# --- Server-Sent Events -------------------------------------------------------------------


class SSEEvent(NamedTuple):
    """One server-sent event: its ``event:`` name (None for the default) and joined ``data:``."""

    event: str | None
    data: str


class SSEDecoder:
    """Incremental SSE parser: feed raw bytes as they arrive, get the events completed so far.

    Comments (lines starting with ``:``, used as keep-alive pings) are skipped, several ``data:``
    lines of one event are joined with a newline, and CRLF line ends are accepted. Bytes are
    decoded only once an event is complete, so a UTF-8 character split across two network
    reads is never broken.

    Usage:
        decoder = SSEDecoder()
        for raw in network_reads:
            for event in decoder.feed(raw):
                ...
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, raw: bytes) -> list[SSEEvent]:
        buffer = self._buffer + raw
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        events: list[SSEEvent] = []
        while True:
            end = buffer.find(b"\n\n")
            if end < 0:
                break
            block, buffer = buffer[:end], buffer[end + 2 :]
            event = _parse_block(block)
            if event is not None:
                events.append(event)
        self._buffer = buffer
        return events

    def close(self) -> list[SSEEvent]:
        """The unterminated event left at the end, if any; SSE says to discard it, so a stream
        reader ignores this, but a tool inspecting a broken stream may want it."""
        block, self._buffer = self._buffer.strip(b"\n"), b""
        event = _parse_block(block) if block else None
        return [event] if event is not None else []


def _parse_block(block: bytes) -> SSEEvent | None:
    name: str | None = None
    data: list[str] = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        key, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if key == b"data":
            data.append(value.decode("utf-8", errors="replace"))
        elif key == b"event":
            name = value.decode("utf-8", errors="replace")
    if not data:
        return None
    return SSEEvent(name, "\n".join(data))


# --- endpoint kinds -------------------------------------------------------------------------


class Exchange(NamedTuple):
    """One earlier turn of a conversation: what the user said and what the server answered."""

    user: str
    assistant: str


@dataclass(frozen=True)
class Prompt:
    """One request's input: the user's text (and its token ids when they are known exactly),
    after a system prompt and the earlier exchanges of its conversation, if any."""

    text: str
    token_ids: tuple[int, ...] | None = None
    system: str | None = None
    history: tuple[Exchange, ...] = ()

    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for user, assistant in self.history:
            messages += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": assistant},
            ]
        return [*messages, {"role": "user", "content": self.text}]

    def completion_text(self) -> str:
        """The prompt as one completions string: the system prompt, a blank line, the text.
        (Conversations of several turns are chat only: ``BenchConfig.conflicts``.)"""
        return f"{self.system}\n\n{self.text}" if self.system else self.text


@dataclass(frozen=True)
class Sampling:
    """What every request of a run asks for besides the prompt.

    ``ignore_eos`` (a vLLM extension) makes the server generate exactly ``max_tokens``.
    ``extra_body`` is merged into the payload last, so it can override anything.
    """

    max_tokens: int
    ignore_eos: bool = True
    temperature: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


class ChoiceText(NamedTuple):
    """What one choice of a chunk carries."""

    token: bool
    """True when the chunk stands for generated tokens (even if their text is still empty)."""
    answer: str
    reasoning: str


class Endpoint(Protocol):
    """One kind of OpenAI-compatible streaming endpoint."""

    name: str
    path: str

    def payload(self, model: str, prompt: Prompt, sampling: Sampling) -> dict[str, Any]:
        """The JSON body for one streaming request."""
        ...

    def read_choice(self, choice: dict[str, Any]) -> ChoiceText:
        """Text of one ``choices[i]`` entry of a chunk."""
        ...


def _common(payload: dict[str, Any], sampling: Sampling) -> dict[str, Any]:
    payload["stream"] = True
    payload["stream_options"] = {"include_usage": True}
    if sampling.ignore_eos:
        payload["ignore_eos"] = True
    if sampling.temperature is not None:
        payload["temperature"] = sampling.temperature
    payload.update(sampling.extra_body)
    return payload


class ChatEndpoint:
    """``/v1/chat/completions``: the system prompt, the earlier exchanges and the user message;
    reasoning read from ``reasoning`` and ``reasoning_content`` (vLLM renamed the field; both
    are read)."""

    name = "chat"
    path = wire.CHAT_PATH

    def payload(self, model: str, prompt: Prompt, sampling: Sampling) -> dict[str, Any]:
        return _common(
            {
                "model": model,
                "messages": prompt.messages(),
                "max_completion_tokens": sampling.max_tokens,
            },
            sampling,
        )

    def read_choice(self, choice: dict[str, Any]) -> ChoiceText:
        delta = choice.get("delta") or {}
        answer = delta.get("content") or ""
        reasoning = reasoning_of(delta)
        if answer or reasoning:
            return ChoiceText(True, answer, reasoning)
        # vLLM's first chunk only announces the role ({"role": "assistant", "content": ""});
        # a later chunk with an empty string stands for a token whose text is not complete yet.
        has_text_field = any(
            isinstance(delta.get(k), str) for k in ("content", *wire.REASONING_FIELDS)
        )
        return ChoiceText(has_text_field and "role" not in delta, "", "")


class CompletionsEndpoint:
    """``/v1/completions``: the prompt is sent as token ids when the prompt carries them (a
    shared prefix's ids are then already in front)."""

    name = "completions"
    path = wire.COMPLETIONS_PATH

    def payload(self, model: str, prompt: Prompt, sampling: Sampling) -> dict[str, Any]:
        if prompt.token_ids is not None:
            body: str | list[int] = list(prompt.token_ids)
        else:
            body = prompt.completion_text()
        return _common(
            {"model": model, "prompt": body, "max_tokens": sampling.max_tokens}, sampling
        )

    def read_choice(self, choice: dict[str, Any]) -> ChoiceText:
        text = choice.get("text")
        return ChoiceText(isinstance(text, str), text or "", "")


ENDPOINTS: dict[str, Endpoint] = {"chat": ChatEndpoint(), "completions": CompletionsEndpoint()}
"""Endpoint kinds by the name users write (``--endpoint chat``)."""


# --- timing one stream ------------------------------------------------------------------------


class StreamAccumulator:
    """Turns a stream's raw reads and their arrival times into a request's measurements.

    Pure: no I/O and no clock of its own. ``feed(raw, t)`` takes a network read and the time
    it arrived (seconds from the request's start); ``finish()`` says how the stream ended.

    Usage:
        acc = StreamAccumulator(ENDPOINTS["chat"])
        acc.feed(b'data: {...}\\n\\n', 0.012)
        fields = acc.finish(clean_end=True)   # dict of RequestRecord fields
    """

    def __init__(self, endpoint: Endpoint, answer: list[str] | None = None) -> None:
        self.endpoint = endpoint
        self.answer = answer
        """Where the answer's text pieces go, when the caller needs the text (a conversation's
        next turn carries it); None keeps only their length."""
        self.decoder = SSEDecoder()
        self.ttft_s: float | None = None
        self.ttfat_s: float | None = None
        self.chunk_times_s: list[float] = []
        self.reasoning_chunks = 0
        self.output_chars = 0
        self.reasoning_chars = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: tuple[ErrorCategory, str] | None = None

    def feed(self, raw: bytes, t: float) -> None:
        for event in self.decoder.feed(raw):
            self._event(event, t)

    def _event(self, event: SSEEvent, t: float) -> None:
        if event.data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(event.data)
        except ValueError:
            self._failed(ErrorCategory.PROTOCOL, f"not JSON: {event.data[:80]!r}")
            return
        if event.event == "error" or (isinstance(chunk, dict) and "error" in chunk):
            self._failed(ErrorCategory.SSE_ERROR, _error_message(chunk))
            return
        if not isinstance(chunk, dict):
            return
        problem = chunk_problem(chunk)
        if problem is not None:
            self._failed(ErrorCategory.PROTOCOL, f"not a chunk ({problem})")
            return
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not choices:
            return
        choice = choices[0]
        text = self.endpoint.read_choice(choice)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if not text.token:
            return
        if self.ttft_s is None:
            self.ttft_s = t
        if text.answer and self.ttfat_s is None:
            self.ttfat_s = t
        if text.reasoning:
            self.reasoning_chunks += 1
            self.reasoning_chars += len(text.reasoning)
        self.output_chars += len(text.answer)
        if self.answer is not None and text.answer:
            self.answer.append(text.answer)
        self.chunk_times_s.append(t)

    def _failed(self, category: ErrorCategory, detail: str) -> None:
        """The stream went wrong; the first fault is the one recorded (later ones follow it)."""
        if self.error is None:
            self.error = (category, detail)

    def finish(self, clean_end: bool) -> dict[str, Any]:
        """RequestRecord fields for this stream. ``clean_end``: the HTTP body ended normally.

        An event not closed by a blank line when the body ends is discarded (the SSE rule).
        """
        usage = self.usage or {}
        output_tokens = usage.get("completion_tokens")
        from_usage = output_tokens is not None
        if not from_usage and self.chunk_times_s:
            output_tokens = len(self.chunk_times_s)
        details = usage.get("completion_tokens_details") or {}
        error = self.error
        if error is None and not (clean_end and self.done):
            error = (
                ErrorCategory.TRUNCATED,
                "stream ended before data: [DONE]" if clean_end else "connection broke off",
            )
        if error is None and not self.chunk_times_s:
            error = (ErrorCategory.EMPTY, "the stream carried no token")
        return {
            "ok": error is None,
            "error": error[0] if error else None,
            "error_detail": error[1] if error else None,
            "ttft_s": self.ttft_s,
            "ttfat_s": self.ttfat_s,
            "e2el_s": self.chunk_times_s[-1] if self.chunk_times_s else None,
            "chunk_times_s": self.chunk_times_s,
            "reasoning_chunks": self.reasoning_chunks,
            "prompt_tokens": usage.get("prompt_tokens"),
            "output_tokens": output_tokens,
            "output_tokens_from_usage": from_usage,
            "reasoning_tokens": details.get("reasoning_tokens"),
            "finish_reason": self.finish_reason,
            "output_chars": self.output_chars,
            "reasoning_chars": self.reasoning_chars,
        }


def _error_message(body: Any) -> str:
    """The human part of an OpenAI-style error body, shortened."""
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        err = err.get("message") or err
    return str(err)[:_DETAIL_CHARS]


@dataclass(frozen=True)
class RequestSlot:
    """Where a request sits in its load point (copied into its record)."""

    index: int
    load_point: str
    scheduled_s: float
    round: int = 1
    conversation: int | None = None
    turn: int | None = None
    prefix_group: int | None = None


async def send_request(
    client: httpx.AsyncClient,
    base_url: str,
    endpoint: Endpoint,
    payload: dict[str, Any],
    slot: RequestSlot,
    *,
    origin: float,
    timeout_s: float,
    clock: Clock = time.perf_counter,
    answer: list[str] | None = None,
) -> RequestRecord:
    """Send one streaming request and measure it; never raises for a failed request.

    Args:
        client: a shared ``httpx.AsyncClient``; its connection limit must allow the concurrency.
        base_url: server root, e.g. ``http://127.0.0.1:8000`` (no ``/v1``).
        endpoint: an ``ENDPOINTS`` entry; payload: from ``endpoint.payload(...)``.
        slot: index, load point label and scheduled time of this request.
        origin: the load point's start on ``clock``; ``start_s`` is measured from it.
        timeout_s: the whole request, connect to last byte.
        clock: monotonic seconds; injectable for tests.
        answer: a list the answer's text pieces are appended to, when the caller needs them.
    """
    start = clock()
    acc = StreamAccumulator(endpoint, answer)
    status: int | None = None
    fields: dict[str, Any]
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", base_url + endpoint.path, json=payload) as response:
                status = response.status_code
                if status >= 300:
                    body = await response.aread()
                    fields = _failure(
                        ErrorCategory.HTTP_STATUS,
                        f"HTTP {status}: {_error_message(_json_or_text(body))}",
                    )
                else:
                    clean = True
                    arrived_at = response.extensions.get(ARRIVED_AT)
                    try:
                        async for raw in response.aiter_raw():
                            at = arrived_at() if arrived_at is not None else None
                            acc.feed(raw, (clock() if at is None else at) - start)
                    except (httpx.RemoteProtocolError, httpx.ReadError):
                        clean = False
                    fields = acc.finish(clean_end=clean)
    except TimeoutError:
        fields = _partial(acc, ErrorCategory.TIMEOUT, f"no complete answer in {timeout_s:g} s")
    except httpx.TimeoutException as exc:
        fields = _partial(acc, ErrorCategory.TIMEOUT, f"{type(exc).__name__}: {exc}")
    except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.ProxyError) as exc:
        fields = _failure(ErrorCategory.CONNECTION, f"{type(exc).__name__}: {exc}")
    except httpx.TransportError as exc:
        fields = _partial(acc, ErrorCategory.TRUNCATED, f"{type(exc).__name__}: {exc}")
    return RequestRecord(
        **asdict(slot), endpoint=endpoint.name, start_s=start - origin, http_status=status, **fields
    )


def _failure(category: ErrorCategory, detail: str) -> dict[str, Any]:
    return {"ok": False, "error": category, "error_detail": detail[:_DETAIL_CHARS]}


def _partial(acc: StreamAccumulator, category: ErrorCategory, detail: str) -> dict[str, Any]:
    """What was measured before the request failed, marked failed."""
    fields = acc.finish(clean_end=False)
    fields.update(_failure(category, detail))
    return fields


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")


# --- server facts -----------------------------------------------------------------------------

_Answer = TypeVar("_Answer", Tokens, Detokenized)


async def _vllm_answer(
    client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any], model: type[_Answer]
) -> _Answer | None:
    """The answer of a POST to one of vLLM's own routes (``/tokenize``, ``/detokenize``):
    optional extras, so a server without them, or answering otherwise, gives None."""
    try:
        response = await client.post(url + path, timeout=30, json=body)
        if response.status_code != 200:
            return None
        return answer_of(model, response, f"POST {path}")
    except (httpx.HTTPError, EndpointError):
        return None


async def tokenize(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    text: str,
    *,
    add_special_tokens: bool = False,
) -> list[int] | None:
    """Token ids of ``text`` from vLLM's ``/tokenize``; None when the server has no such route.
    With ``add_special_tokens``, as the completions route counts a text prompt (BOS first on
    most tokenizers)."""
    body = {"model": model, "prompt": text, "add_special_tokens": add_special_tokens}
    answer = await _vllm_answer(client, base_url, wire.TOKENIZE_PATH, body, Tokens)
    return answer.tokens if answer is not None else None


async def count_tokens(
    client: httpx.AsyncClient, base_url: str, model: str, endpoint: str, prompt: Prompt
) -> int | None:
    """How many prompt tokens the server will count for ``prompt`` on ``endpoint`` (``chat``:
    its messages through the chat template; ``completions``: its text with the special tokens
    the route adds), from vLLM's ``/tokenize``; None when the server has no such route."""
    body: dict[str, Any] = {"model": model}
    if endpoint == "chat":
        body |= {"messages": prompt.messages(), "add_generation_prompt": True}
    else:
        body |= {"prompt": prompt.completion_text(), "add_special_tokens": True}
    answer = await _vllm_answer(client, base_url, wire.TOKENIZE_PATH, body, Tokens)
    return answer.count if answer is not None else None


async def detokenize(
    client: httpx.AsyncClient, base_url: str, model: str, token_ids: list[int]
) -> str | None:
    """Text of ``token_ids`` from vLLM's ``/detokenize``; None when unavailable."""
    body = {"model": model, "tokens": token_ids}
    answer = await _vllm_answer(client, base_url, wire.DETOKENIZE_PATH, body, Detokenized)
    return answer.prompt if answer is not None else None


async def server_version(client: httpx.AsyncClient, base_url: str) -> str | None:
    """vLLM's ``/version``, or None for servers without it."""
    try:
        response = await client.get(base_url + wire.VERSION_PATH, timeout=10)
        return str(response.json().get("version")) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
