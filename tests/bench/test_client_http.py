"""send_request over httpx.MockTransport replaying bytes recorded from vLLM: every failure is a
record with a category, never an exception."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from tandem.bench.records import ErrorCategory
from tandem.bench.timed_request import ENDPOINTS, Prompt, RequestSlot, Sampling, send_request


class Chunks(httpx.AsyncByteStream):
    """A response body that arrives in reads of 64 bytes, like a network stream."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self):
        for i in range(0, len(self.data), 64):
            yield self.data[i : i + 64]


def send(handler, endpoint: str = "completions", timeout_s: float = 5.0):
    ticks = itertools.count()
    clock = lambda: next(ticks) * 0.001  # noqa: E731  one ms per reading

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            ep = ENDPOINTS[endpoint]
            payload = ep.payload("tiny", Prompt("hi", (1, 2, 3)), Sampling(max_tokens=8))
            return await send_request(
                client,
                "http://server",
                ep,
                payload,
                RequestSlot(0, "c1", 0.0),
                origin=0.0,
                timeout_s=timeout_s,
                clock=clock,
            )

    return asyncio.run(go())


def test_a_recorded_stream_becomes_an_ok_record(fixture_bytes):
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"], seen["body"] = str(request.url), request.content
        return httpx.Response(
            200,
            stream=Chunks(fixture_bytes("sse_completions_ok.txt")),
            headers={"content-type": "text/event-stream"},
        )

    record = send(handler)
    assert seen["url"] == "http://server/v1/completions"
    assert b'"prompt":[1,2,3]' in seen["body"] and b'"ignore_eos":true' in seen["body"]
    assert b'"include_usage":true' in seen["body"]
    assert record.ok and record.output_tokens == 8 and record.http_status == 200
    assert record.start_s == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("status", "fixture", "detail"),
    [
        (
            400,
            "sse_completions_too_long.txt",
            "max_tokens=5000 cannot be greater than max_model_len",
        ),
        (404, "sse_chat_unknown_model.txt", "The model `nope` does not exist"),
    ],
    ids=["400 too many tokens", "404 unknown model"],
)
def test_non_2xx_is_an_http_status_failure_with_the_servers_message(
    fixture_bytes, status, fixture, detail
):
    record = send(lambda r: httpx.Response(status, content=fixture_bytes(fixture)))
    assert not record.ok and record.error is ErrorCategory.HTTP_STATUS
    assert record.http_status == status and detail in record.error_detail


def test_refused_connection_is_a_connection_failure():
    def handler(request):
        raise httpx.ConnectError("connection refused", request=request)

    record = send(handler)
    assert record.error is ErrorCategory.CONNECTION and record.ttft_s is None


def test_a_read_timeout_is_a_timeout_failure():
    def handler(request):
        raise httpx.ReadTimeout("read timed out", request=request)

    assert send(handler).error is ErrorCategory.TIMEOUT
