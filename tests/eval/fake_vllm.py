"""A fake vLLM server on 127.0.0.1 for the answers check: a model that is sure of its answers,
on the three routes the check uses, in vLLM's own response shapes (``/tokenize`` with messages,
``/v1/completions`` with ``logprobs`` and token ids as tokens, ``prompt_logprobs``).

Its "model": the template is the messages' text as bytes, one token a byte (``+ 3``), between
a start token and a generation prompt; the greedy answer to a prompt is ``It is X.`` with X the
ground truth of a known question found in the prompt, else a word drawn from the prompt's ids;
every greedy token has log-probability -0.1 and leads its runner-up by 2 nats. A system message
or an earlier turn changes the answer (``as told``, ``again``). A teacher-forced
token scores -0.1 where it is the model's own answer and -3 where it is not.

``mode`` changes it, as a revision would:

- ``good``: as above;
- ``garbled``: answers ``Zzz.`` to everything and scores every token 2.5 nats lower;
- ``lossy``: the template keeps only the last message (an earlier turn or a system message
  is lost);
- ``random``: the good answers, but every token a near tie (leads by 0.01 nats).

Usage:
    with fake_vllm() as fake:
        fake.mode = "garbled"
        AnswerClient(fake.url, fake.model)...
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tandem.eval.prompt_sets import builtin_known

START, GO, STOP = 1, 4, 2
KNOWN = {p.messages[-1]["content"]: p.answers[0] for p in builtin_known().prompts}


def encode(text: str) -> list[int]:
    return [b + 5 for b in text.encode()]


def decode(ids: list[int]) -> str:
    return bytes(i - 5 for i in ids if i >= 5).decode(errors="replace")


@dataclass
class Fake:
    port: int
    model: str = "fake-smol"
    mode: str = "good"
    requests: list[dict] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def template(self, messages: list[dict[str, str]]) -> list[int]:
        kept = messages[-1:] if self.mode == "lossy" else messages
        ids = [START]
        for m in kept:
            ids += encode(f"{m['role']}:{m['content']}|")
        return [*ids, GO]

    def answer(self, prompt: list[int]) -> list[int]:
        if self.mode == "garbled":
            return [*encode("Zzz."), STOP]
        text = decode(prompt)
        truth = next((a for q, a in KNOWN.items() if q in text), None)
        if truth is None:
            truth = ["sea", "sky", "stone", "river"][sum(prompt) % 4]
            if "|assistant:" in text:  # an earlier turn: the answer depends on it
                truth += " again"
            if "system:" in text:  # so does a system message
                truth += " as told"
        return [*encode(f"It is {truth}."), STOP]

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = list(body["prompt"])
        ids = self.answer(prompt)[: body["max_tokens"]]
        lead = 0.01 if self.mode == "random" else 2.0
        return {
            "choices": [
                {
                    "index": 0,
                    "text": decode(ids),
                    "finish_reason": "stop" if ids[-1] == STOP else "length",
                    "logprobs": {
                        "tokens": [f"token_id:{i}" for i in ids],
                        "token_logprobs": [-0.1] * len(ids),
                        "top_logprobs": [
                            {f"token_id:{i}": -0.1, "token_id:3": -0.1 - lead} for i in ids
                        ],
                        "text_offset": list(range(len(ids))),
                    },
                    "prompt_logprobs": None,
                }
            ]
        }

    def score(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = list(body["prompt"])
        go = len(ids) - 1 - ids[::-1].index(GO)
        own = self.answer(ids[: go + 1])
        shift = -2.5 if self.mode == "garbled" else 0.0
        entries: list[dict | None] = [None]
        for position in range(1, len(ids)):
            k = position - go - 1
            mine = 0 <= k < len(own) and ids[position] == own[k]
            logprob = (-0.1 if mine or k < 0 else -3.0) + shift
            entries.append({str(ids[position]): {"logprob": logprob, "rank": 1}})
        return {"choices": [{"index": 0, "text": ".", "prompt_logprobs": entries}]}


@contextmanager
def fake_vllm() -> Iterator[Fake]:
    """Serve until the block ends."""
    fake = Fake(port=0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: with Nagle's algorithm on, each answer on a
        # kept-alive connection waits for the client's delayed ACK (about 40 ms a request).
        disable_nagle_algorithm = True

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, payload: dict[str, Any], status: int = 200) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send({"data": [{"id": fake.model, "max_model_len": 2048, "root": "x"}]})
            else:
                self._send({"error": "no route"}, 404)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append({"path": self.path, **body})
            if self.path == "/tokenize":
                tokens = fake.template(body["messages"])
                self._send({"count": len(tokens), "tokens": tokens, "max_model_len": 2048})
            elif self.path == "/v1/completions" and "prompt_logprobs" in body:
                self._send(fake.score(body))
            elif self.path == "/v1/completions":
                self._send(fake.generate(body))
            else:
                self._send({"error": "no route"}, 404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
