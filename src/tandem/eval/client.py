"""Chat requests to an OpenAI-compatible endpoint, with retries only where a retry can help.

- Retried, with exponential back-off and jitter, until ``retry_budget_s`` is spent: connection
  errors, timeouts, broken responses (``httpx.TransportError``) and HTTP 5xx. A server that is
  restarting is waited for.
- Never retried: HTTP 4xx. The answer is recorded as an error sample (``ChatResponse.error``),
  because asking again gives the same answer.
- Timeouts are per request and sized for long generations: ``read`` is the whole time a
  non-streaming 32K-token answer may take (default one hour), ``connect`` is short.

Reasoning is read from the message's ``reasoning`` (vLLM ≥ 0.10), ``reasoning_content`` (older
vLLM, DeepSeek API) or ``<think>`` blocks inside ``content``, and kept apart from the answer.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx
from pydantic import BaseModel, Field

from tandem import wire
from tandem.endpoint import (
    AsyncEndpoint,
    ChatCompletion,
    Usage,
    answer_of,
    chat_body,
    reasoning_of,
)
from tandem.errors import EndpointError
from tandem.eval.extract import split_reasoning

RETRYABLE_STATUS_MIN = 500


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying a request that failed for a retryable reason.

    Usage:
        RetryPolicy(budget_s=900, first_delay_s=1, max_delay_s=30)
    """

    budget_s: float = 900.0
    """Seconds of retrying before a request is given up (the run then stops, resumable)."""
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0

    def delay_s(self, attempt: int) -> float:
        """Back-off before retry number ``attempt`` (1-based): doubling, capped, ±25% jitter."""
        base = min(self.max_delay_s, self.first_delay_s * 2 ** (attempt - 1))
        return base * random.uniform(0.75, 1.25)


class ChatResponse(BaseModel):
    """One finished chat request: the answer apart from the reasoning, and its costs.
    The log saves it as is, with the extracted answer added (``log.ResponseRecord``)."""

    content: str = ""
    """The answer text, ``<think>`` blocks removed."""
    reasoning: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    latency_s: float = 0.0
    attempts: int = 1
    error: str | None = None
    """Set for a request the server refused (4xx): ``"http-400: <body excerpt>"``."""
    raw_content: str | None = Field(default=None, repr=False)
    """``content`` exactly as the server sent it, for rescoring."""


class ChatClient:
    """Sends chat-completion requests to one endpoint and model.

    Usage:
        async with ChatClient("http://127.0.0.1:8000", "tiny") as client:
            response = await client.chat([{"role": "user", "content": "hi"}], {"max_tokens": 8})
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        request_timeout_s: float = 3600.0,
        connect_timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.endpoint = AsyncEndpoint(
            base_url,
            api_key=api_key,
            transport=transport,
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
        )
        self.model = model
        self.retry = retry or RetryPolicy()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.endpoint.aclose()

    async def chat(self, messages: list[dict], params: dict) -> ChatResponse:
        """One non-streaming chat completion, retried on connection errors and 5xx.

        Raises:
            EndpointError: retryable failures went on for longer than the retry budget.
        """
        payload = chat_body(self.model, messages, params)
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            sent = time.perf_counter()
            try:
                reply = await self.endpoint.post_chat(payload)
            except httpx.TransportError as exc:
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if reply.status_code < 400:
                    return _read(reply, time.perf_counter() - sent, attempt)
                if reply.status_code < RETRYABLE_STATUS_MIN:
                    return ChatResponse(
                        error=f"http-{reply.status_code}: {reply.text[:500]}",
                        latency_s=time.perf_counter() - sent,
                        attempts=attempt,
                    )
                reason = f"HTTP {reply.status_code}: {reply.text[:200]}"
            delay = self.retry.delay_s(attempt)
            if time.monotonic() - started + delay > self.retry.budget_s:
                raise EndpointError(
                    f"{self.endpoint.url} kept failing for {time.monotonic() - started:.0f} s "
                    f"({attempt} attempts); last: {reason}",
                    hint="check that the server is running and the URL is right, then rerun "
                    "with --resume: finished questions are kept",
                )
            await asyncio.sleep(delay)


def _read(reply: httpx.Response, latency_s: float, attempts: int) -> ChatResponse:
    """A response from an answer; one that is not a chat completion is recorded as an error
    (as a refusal is), not a traceback that ends the run."""
    try:
        body = answer_of(ChatCompletion, reply, f"POST {wire.CHAT_PATH}")
    except EndpointError as exc:
        return ChatResponse(
            error=f"http-{reply.status_code}: {exc.message}", latency_s=latency_s, attempts=attempts
        )
    choice = body.choices[0]
    message = choice.message
    raw = message.content or ""
    reasoning_field = reasoning_of(message.model_dump())
    think, answer = split_reasoning(raw)
    usage = body.usage or Usage()
    details = usage.completion_tokens_details or {}
    return ChatResponse(
        content=answer,
        reasoning="\n".join(p for p in (reasoning_field.strip(), think) if p),
        finish_reason=choice.finish_reason,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        reasoning_tokens=details.get("reasoning_tokens"),
        latency_s=latency_s,
        attempts=attempts,
        raw_content=raw,
    )
