"""Retry policy of the chat client, through httpx's own MockTransport (the transport seam)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tandem.errors import EndpointError, Unauthorized
from tandem.eval.client import ChatClient, RetryPolicy

FAST = RetryPolicy(budget_s=5.0, first_delay_s=0.001, max_delay_s=0.002)
OK_BODY = {
    "choices": [
        {
            "message": {"content": "<think>hmm B</think>ANSWER: C", "reasoning": None},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 7},
}


def run_chat(handler, retry: RetryPolicy = FAST):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        async with ChatClient(
            "http://x", "m", retry=retry, transport=httpx.MockTransport(handler)
        ) as client:
            return await client.chat([{"role": "user", "content": "q"}], {"max_tokens": 8})

    return asyncio.run(go())


def test_retries_connect_errors_and_5xx_then_succeeds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.ConnectError("refused", request=request)
        if len(calls) == 2:
            return httpx.Response(503, text="loading")
        return httpx.Response(200, json=OK_BODY)

    response = run_chat(handler)
    assert len(calls) == 3 and response.attempts == 3
    assert response.content == "ANSWER: C"
    assert response.reasoning == "hmm B"
    assert (response.finish_reason, response.completion_tokens) == ("stop", 7)


def test_4xx_is_recorded_never_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(400, text="maximum context length exceeded")

    response = run_chat(handler)
    assert len(calls) == 1
    assert response.error is not None and response.error.startswith("http-400")


def test_gives_up_after_the_retry_budget() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="boom")

    with pytest.raises(EndpointError) as info:
        run_chat(handler, RetryPolicy(budget_s=0.05, first_delay_s=0.01, max_delay_s=0.01))
    assert "--resume" in (info.value.hint or "")


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_fields_are_read(field: str) -> None:
    body = {
        "choices": [
            {"message": {"content": "ANSWER: A", field: "think think"}, "finish_reason": "stop"}
        ],
        "usage": {},
    }
    response = run_chat(lambda request: httpx.Response(200, json=body))
    assert (response.reasoning, response.content) == ("think think", "ANSWER: A")


def test_the_key_is_sent_as_a_bearer_token_and_a_401_names_the_fix() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != "Bearer s3cret":
            return httpx.Response(401, json={"error": "Unauthorized"})
        return httpx.Response(200, json={"data": [{"id": "m"}]})

    async def models(key: str | None) -> list[str]:
        async with ChatClient(
            "http://x", "m", api_key=key, transport=httpx.MockTransport(handler)
        ) as client:
            return [m.id for m in await client.endpoint.models(timeout_s=30.0)]

    assert asyncio.run(models("s3cret")) == ["m"]
    with pytest.raises(Unauthorized) as caught:
        asyncio.run(models(None))
    assert "VLLM_API_KEY" in (caught.value.hint or "")
