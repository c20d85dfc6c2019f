"""The one client of an OpenAI-compatible server: model listing, picking, chat, health, 401."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tandem.endpoint import AsyncEndpoint, Endpoint, ServedModel, pick_model, reasoning_of
from tandem.errors import EndpointError, Unauthorized

MODELS = {"data": [{"id": "tiny", "max_model_len": 4096, "root": "/models/tiny"}]}


def server(request: httpx.Request) -> httpx.Response:
    """An OpenAI-compatible server that wants the key `k`."""
    if request.headers.get("authorization") != "Bearer k":
        return httpx.Response(401, json={"error": "Unauthorized"})
    if request.url.path == "/v1/models":
        return httpx.Response(200, json=MODELS)
    if request.url.path == "/v1/chat/completions":
        body = request.read().decode()
        return httpx.Response(200, json={"choices": [{"message": {"content": body}}]})
    return httpx.Response(200 if request.url.path == "/health" else 404)


def blocking(api_key: str | None) -> Endpoint:
    client = httpx.Client(transport=httpx.MockTransport(server))
    return Endpoint("http://leader:8000/", api_key=api_key, client=client)


def test_the_blocking_client_lists_chats_and_sends_the_key():
    with blocking("k") as endpoint:
        assert endpoint.health_status() == 200
        assert endpoint.models() == [ServedModel("tiny", 4096, "/models/tiny")]
        body = endpoint.chat("tiny", [{"role": "user", "content": "hi"}], max_tokens=2)
        sent = body["choices"][0]["message"]["content"]
        assert '"model":"tiny"' in sent and '"max_tokens":2' in sent and '"stream":false' in sent


@pytest.mark.parametrize("call", ["models", "chat"])
def test_a_401_is_unauthorized_with_the_fix(call):
    with blocking(None) as endpoint, pytest.raises(Unauthorized) as caught:
        endpoint.models() if call == "models" else endpoint.chat("tiny", [])
    assert caught.value.code == "endpoint-unauthorized"


def test_an_unreachable_server_is_one_endpoint_error():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = httpx.Client(transport=httpx.MockTransport(refuse))
    endpoint = Endpoint("http://leader:8000", client=client)
    with pytest.raises(EndpointError, match=r"cannot list models at http://leader:8000/v1/models"):
        endpoint.models()
    with pytest.raises(EndpointError, match=r"GET /health: ConnectError connection refused"):
        endpoint.health_status()


def test_the_async_twin_lists_the_same_models():
    async def models(key: str | None) -> list[ServedModel]:
        transport = httpx.MockTransport(server)
        async with AsyncEndpoint("http://leader:8000", api_key=key, transport=transport) as e:
            return await e.models()

    assert asyncio.run(models("k")) == [ServedModel("tiny", 4096, "/models/tiny")]
    with pytest.raises(Unauthorized):
        asyncio.run(models(None))


@pytest.mark.parametrize(
    "wanted, served, expected",
    [
        (None, ["tiny"], "tiny"),
        ("b", ["a", "b"], "b"),
        (None, ["a", "b"], "the server serves 2 models (a, b)"),
        (None, [], "the server serves 0 models (none)"),
        ("c", ["a"], "the server does not serve 'c' (it serves: a)"),
    ],
    ids=[
        "no name, the only model",
        "the named one among several",
        "no name, several models",
        "no name, no model",
        "a name the server does not serve",
    ],
)
def test_pick_model(wanted, served, expected):
    models = [ServedModel(name, None, None) for name in served]
    if expected in served:
        assert pick_model(models, wanted).id == expected
    else:
        with pytest.raises(EndpointError) as caught:
            pick_model(models, wanted)
        assert caught.value.message == expected


@pytest.mark.parametrize(
    "message, expected",
    [
        ({"reasoning": "r", "content": "a"}, "r"),
        ({"reasoning_content": "old"}, "old"),
        ({"reasoning": "", "reasoning_content": "old"}, "old"),
        ({"content": "a"}, ""),
    ],
    ids=["vLLM 0.10 field", "older field", "empty new field, older one set", "no reasoning"],
)
def test_reasoning_is_read_from_either_field(message, expected):
    assert reasoning_of(message) == expected
