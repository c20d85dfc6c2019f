"""The front door (``tandem front``): one endpoint routing each request by its ``model``, a
list of exactly the models its watcher found serving, OpenAI's 404 for the rest at once, and a
process owned by its own record.

The deployments behind it are stub OpenAI servers (``openai_stub``); the real engines are
``test_models_engine.py``'s.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from openai_stub import STREAM, openai_stub
from ports import free_port
from starlette.testclient import TestClient

from tandem.backends import front_door
from tandem.backends.front_app import Routes, Upstream, front_app
from tandem.errors import BackendError
from tandem.operations import front
from tandem.operations.health import Verdict

CHAT = "/v1/chat/completions"


def ask(client: TestClient, model: str | None, **extra: object) -> httpx.Response:
    body: dict = {"messages": [{"role": "user", "content": "hi"}], **extra}
    if model is not None:
        body["model"] = model
    return client.post(CHAT, json=body, headers={"Authorization": "Bearer k"})


def test_each_request_goes_to_the_deployment_serving_its_model():
    with openai_stub() as a, openai_stub() as b:
        routes = Routes()
        routes.replace(
            [Upstream(model="smollm2", deployment="a", url=a.url),
             Upstream(model="gemma3-270m", deployment="b", url=b.url)]
        )  # fmt: skip
        with TestClient(front_app(routes, api_key=None)) as client:
            assert ask(client, "smollm2").json()["choices"][0]["message"]["content"] == "ANSWER: A"
            assert ask(client, "gemma3-270m").status_code == 200
            assert ask(client, "gemma3-270m").status_code == 200
            streamed = ask(client, "smollm2", stream=True)
        assert [body["model"] for body in a.bodies] == ["smollm2", "smollm2"]
        assert [body["model"] for body in b.bodies] == ["gemma3-270m", "gemma3-270m"]
        assert a.authorizations == ["Bearer k", "Bearer k"]  # the client's key goes on
        assert streamed.status_code == 200 and streamed.content == STREAM
        assert streamed.headers["content-type"].startswith("text/event-stream")


def test_a_model_not_served_gets_openais_404_at_once_and_a_bad_body_a_400():
    routes = Routes()
    with TestClient(front_app(routes, api_key=None)) as client:
        started = time.monotonic()
        missing = ask(client, "gone")
        assert time.monotonic() - started < 1
        no_model = ask(client, None)
        not_json = client.post(CHAT, content=b"[1, 2")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"message": "The model `gone` does not exist.", "type": "NotFoundError",
                  "param": "model", "code": 404}
    }  # fmt: skip
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
    assert not_json.status_code == 400


def test_an_endpoint_that_does_not_answer_is_a_503_not_a_hang():
    routes = Routes()
    routes.replace([Upstream(model="m", deployment="d", url=f"http://127.0.0.1:{free_port()}")])
    with TestClient(front_app(routes, api_key=None)) as client:
        answer = ask(client, "m")
    assert answer.status_code == 503
    assert answer.json()["error"]["type"] == "ServiceUnavailableError"
    assert "deployment d" in answer.json()["error"]["message"]


def test_the_model_list_is_exactly_the_routes_behind_the_key():
    routes = Routes()
    routes.replace(
        [Upstream(model="b", deployment="db", url="http://x", max_model_len=2048, created=5),
         Upstream(model="a", deployment="da", url="http://y", root="org/a")]
    )  # fmt: skip
    with TestClient(front_app(routes, api_key="k")) as client:
        assert client.get("/v1/models").status_code == 401
        listed = client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()
        one = client.get("/v1/models/b", headers={"Authorization": "Bearer k"}).json()
        routes.replace([])
        empty = client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == ["a", "b"]
    assert listed["data"][0]["root"] == "org/a" and one["max_model_len"] == 2048
    assert empty == {"object": "list", "data": []}


def member(name: str, model: str, verdict: Verdict, reason: str = "") -> front.Member:
    return front.Member(
        deployment=name, model=model, endpoint=f"http://{name}", verdict=verdict, reason=reason
    )


def test_the_watcher_lists_what_serves_and_says_who_left_and_why(monkeypatch):
    looks = [
        [member("a", "smollm2", Verdict.HEALTHY), member("b", "gemma", Verdict.STARTING)],
        [member("a", "smollm2", Verdict.HEALTHY), member("b", "gemma", Verdict.DEGRADED)],
        [member("a", "smollm2", Verdict.DOWN, "the leader is gone"),
         member("b", "gemma", Verdict.HEALTHY)],
    ]  # fmt: skip
    seen: list[list[str]] = []
    said: list[str] = []
    routes = Routes()
    stop = threading.Event()

    def next_look(trackers: dict) -> list[front.Member]:
        if len(seen) == len(looks):
            stop.set()
            return looks[-1]
        seen.append([u.model for u in routes.listed()])
        return looks[len(seen) - 1]

    monkeypatch.setattr(front, "members", next_look)
    front.watch(routes, 0.01, stop, said.append)
    assert seen == [[], ["smollm2"], ["gemma", "smollm2"]]
    assert [u.model for u in routes.listed()] == ["gemma"]
    assert said == [
        "model 'smollm2' joined: deployment a serves",
        "model 'gemma' joined: deployment b serves",
        "model 'smollm2' left (deployment a: down: the leader is gone)",
    ]


def test_the_process_is_owned_by_its_own_record(tmp_path: Path, monkeypatch):
    """Started, it answers and lists nothing (no deployment); a second start is refused; stop
    ends that process and removes its record, and the log stays."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    port = free_port()
    door = front.start(port=port, interval_s=0.5)
    try:
        assert door.running() and front_door.read() == door
        assert httpx.get(door.url + "/v1/models", timeout=5).json() == {
            "object": "list",
            "data": [],
        }
        with pytest.raises(BackendError, match="already runs"):
            front.start(port=free_port())
        assert front.status().running and front.front_door_line()
    finally:
        stopped = front.stop()
    assert stopped == door and not door.running()
    assert front_door.read() is None and Path(door.log).is_file()
    assert front.stop() is None and front.front_door_line() is None


def test_a_taken_port_is_refused_before_anything_starts(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    with openai_stub() as taken, pytest.raises(BackendError, match="is already in use"):
        front.start(port=taken.port)
    assert front_door.read() is None
