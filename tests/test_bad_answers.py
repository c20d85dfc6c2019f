"""A server that answers 200 with a body that is not the JSON object asked for (issue 46,
class 3), and one that does not answer at all (class 6): a verdict or a message, never a
traceback.

Every answer is read into its typed model in ``tandem.endpoint`` (``answer_of``); a wrong
shape is the ``EndpointError`` that the smoke checks turn into a failed check, the upgrade's
gate into a failed gate, the GPQA client into an error record, the bench into a failed request.
"""

from __future__ import annotations

import asyncio
import json
import tarfile
import time

import httpx
import pytest

from tandem.backends.state import DeploymentState
from tandem.endpoint import ChatCompletion, Endpoint, Tokens, answer_of
from tandem.errors import EndpointError
from tandem.eval import smoke
from tandem.eval.client import ChatClient, RetryPolicy
from tandem.eval.smoke import Outcome, SmokeTarget
from tandem.upgrade import GateLimits, gate
from tests.factories import make_recipe
from tests.openai_stub import HANG, MODEL, openai_stub
from tests.test_bad_input import old_state

CHAT = "POST /v1/chat/completions"
TOKENIZE = "POST /tokenize"
BROKEN = {
    "not JSON": (b"<html>502 Bad Gateway</html>", "not JSON"),
    "a list": (b"[1, 2]", "a JSON list"),
    "a string": (b'"ok"', "a JSON string"),
    "no choices": (b"{}", "choices: Field required"),
    "choices not a list": (b'{"choices": "x"}', "choices: Input should be a valid list"),
    "no choice": (b'{"choices": []}', "choices: List should have at least 1 item"),
    "a message that is text": (b'{"choices": [{"message": "hi"}]}', "choices.0.message"),
    "tool calls not a list": (
        b'{"choices": [{"message": {"content": "", "tool_calls": {"a": 1}}}]}',
        "choices.0.message.tool_calls",
    ),
    "logprobs of another shape": (
        b'{"choices": [{"message": {}, "logprobs": {"content": [{"top_logprobs": [1]}]}}]}',
        "choices.0.logprobs.content.0.top_logprobs.0",
    ),
    "usage not an object": (b'{"choices": [{"message": {}}], "usage": 7}', "usage"),
}


def response(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, request=httpx.Request("POST", "http://h/x"))


@pytest.mark.parametrize("body,said", BROKEN.values(), ids=BROKEN)
def test_a_chat_answer_of_another_shape_is_an_endpoint_error_naming_it(body, said):
    with pytest.raises(EndpointError) as broken:
        answer_of(ChatCompletion, response(body), "POST /v1/chat/completions")
    assert "POST /v1/chat/completions answered 200" in broken.value.message
    assert said in broken.value.message and repr(body.decode()[:20])[:-1] in broken.value.message


@pytest.mark.parametrize("body", [b"[3]", b'{"tokens": "3"}', b'{"tokens": [{"id": 3}]}', b"x"])
def test_a_tokenize_answer_of_another_shape_is_an_endpoint_error(body):
    with pytest.raises(EndpointError, match="POST /tokenize answered 200"):
        answer_of(Tokens, response(body), "POST /tokenize")


def test_what_the_server_sent_beyond_the_model_is_kept():
    body = b'{"choices": [{"message": {"content": "x", "extra": 1}}], "id": "c1"}'
    answer = answer_of(ChatCompletion, response(body), "POST /v1/chat/completions")
    assert answer.model_dump(exclude_unset=True)["choices"][0]["message"]["extra"] == 1


@pytest.mark.parametrize(
    "answers,check",
    [
        ({TOKENIZE: (200, b"[3]")}, "template"),
        ({TOKENIZE: (200, b'{"tokens": [1]}'), CHAT: (200, b'{"choices": "x"}')}, "template"),
        ({CHAT: (200, b"not json")}, "determinism"),
        ({CHAT: (200, b'{"choices": [{"message": []}]}')}, "reasoning"),
    ],
    ids=["tokenize a list", "chat of another shape", "chat not JSON", "a message that is a list"],
)
def test_a_smoke_check_answered_with_another_shape_fails_and_the_run_goes_on(
    tmp_path, answers, check
):
    with openai_stub(answers) as stub:
        target = SmokeTarget(url=stub.url, model=MODEL, reasoning_parser="qwen3")
        report = smoke.run_smoke(
            target, tmp_path, smoke.SmokeRun(checks=[check, "tools"], timeout_s=5)
        )
    broken, after = report.checks
    assert (
        broken.outcome is Outcome.FAIL and "answered 200 with a body that is not" in broken.summary
    )
    assert after.check == "tools"  # the run went on


def test_a_streamed_event_of_another_shape_is_an_endpoint_error():
    stream = b'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: {"choices": ["x"]}\n\n'
    with openai_stub({CHAT: (200, stream)}) as stub:
        server = smoke.Server(SmokeTarget(url=stub.url, model=MODEL), None, 5)
        try:
            with pytest.raises(EndpointError, match="an event with a body that is not a ChatChunk"):
                server.stream_steps([], max_tokens=1)
        finally:
            server.close()


def test_the_upgrade_gate_fails_on_a_broken_answer_instead_of_a_traceback(tmp_path):
    recipe = make_recipe(name="demo", tp=1).model_dump(mode="json")
    with openai_stub({TOKENIZE: (200, b"[1]")}) as stub:
        state = DeploymentState(
            name="demo", backend="local", recipe=recipe, cluster={}, endpoint=stub.url, model=MODEL
        )
        result = gate(state, (None, []), GateLimits(bench=False), tmp_path)
    assert not result.passed and "smoke template" in (result.check or "")
    assert "not a Tokens object" in (result.check or "")


@pytest.mark.parametrize("body", [b"<html/>", b"[1]", b'{"choices": {}}'])
def test_a_gpqa_answer_of_another_shape_is_recorded_as_an_error(body):
    async def go():  # type: ignore[no-untyped-def]
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
        retry = RetryPolicy(budget_s=1.0)
        async with ChatClient("http://x", "m", retry=retry, transport=transport) as client:
            return await client.chat([{"role": "user", "content": "q"}], {"max_tokens": 8})

    recorded = asyncio.run(go())
    assert recorded.error and recorded.error.startswith("http-200:"), recorded


def test_a_bench_request_streamed_with_another_shape_is_a_failed_request(tandem_here, tmp_path):
    (tmp_path / "p.txt").write_text("hi\n")
    stream = b'data: {"choices": ["x"]}\n\ndata: [DONE]\n\n'
    with openai_stub({CHAT: (200, stream)}) as stub:
        result = tandem_here(
            "bench", "--url", stub.url, "--prompt-file", str(tmp_path / "p.txt"), "--requests",
            "1", "--warmup", "0", "--no-server-metrics", "-q", "--out", str(tmp_path / "b"),
            "--no-plots",
        )  # fmt: skip
    assert result.code == 0, result.err
    lines = (tmp_path / "b" / "requests.jsonl").read_text().splitlines()
    (record,) = [json.loads(line) for line in lines]
    assert record["error"] == "protocol" and "not a chunk" in record["error_detail"]


def test_endpoint_chat_of_another_shape_is_an_endpoint_error():
    with (
        openai_stub({CHAT: (200, b"[]")}) as stub,
        Endpoint(stub.url) as server,
        pytest.raises(EndpointError, match="a JSON list"),
    ):
        server.chat(MODEL, [{"role": "user", "content": "hi"}])


DAMAGED = {
    "recipe without its model": lambda d: d["recipe"].pop("model"),
    "recipe engine a list": lambda d: d["recipe"].update(engine=[1]),
    "an empty recipe": lambda d: d.update(recipe={}),
    "cluster nodes a string": lambda d: d["cluster"].update(nodes="x"),
}


@pytest.mark.parametrize("damage", DAMAGED.values(), ids=DAMAGED)
def test_a_bundle_of_a_state_whose_recipe_is_unreadable_is_written(
    tmp_path, monkeypatch, tandem_here, damage
):
    state = old_state(tmp_path, monkeypatch)
    data = json.loads(state.directory.state_file.read_text())
    for launched in [data, *data["groups"]]:  # the deployment's and its group's, as saved
        damage(launched)
    state.directory.state_file.write_text(json.dumps(data))
    done = tandem_here("logs", "olddemo", "--bundle", str(tmp_path / "b.tar.gz"))
    assert done.code == 0 and "Traceback" not in done.err, done.err
    with tarfile.open(tmp_path / "b.tar.gz") as archive:
        names = archive.getnames()
        note = archive.extractfile("olddemo-bundle/ranks/UNPLANNED.txt")
        assert note is not None and b"lacks a part the plan reads" in note.read()
    assert {"olddemo-bundle/recipe.yaml", "olddemo-bundle/ranks/rank0.log"} <= set(names)


# --- class 6: a server that hangs ---------------------------------------------------------------


def test_smoke_against_a_hanging_server_ends_at_the_request_timeout_and_says_so(
    tandem_here, tmp_path, monkeypatch
):
    monkeypatch.setattr(smoke, "PROGRESS_EVERY_S", 0.3)
    with openai_stub({TOKENIZE: HANG}) as stub:
        started = time.monotonic()
        result = tandem_here(
            "eval", "smoke", "--url", stub.url, "--check", "template", "--request-timeout", "1.5",
            "--out", str(tmp_path / "s"),
        )  # fmt: skip
        took = time.monotonic() - started
    assert result.code == 1 and took < 30, (took, result.err)
    assert "template: running" in result.err
    assert "template: still waiting for the server after" in result.err
    assert "--request-timeout" in result.err
    assert "did not answer" in result.out and "Traceback" not in result.err
