"""A stub OpenAI-compatible server on 127.0.0.1, for tests of what a client run writes and prints.

It lists one model, answers a chat completion with ``ANSWER: A`` (JSON, or the recorded vLLM
stream of ``fixtures/bench/sse_chat_ok.txt`` when ``stream`` is asked), has no ``/metrics``, and
keeps the ``Authorization`` header of every request, so a test can see what credentials arrived,
and the body of every chat completion, so it can see what was asked.
It is a real socket (the bench sends through aiohttp, eval through httpx).

``answers`` replaces what a route answers (``"POST /tokenize"``, ``"POST /v1/chat/completions"``)
with a status and a body, or a function of the request's ``Authorization`` header giving them
(a server that quotes the key in its error), or ``HANG`` (it never answers).

Usage:
    with openai_stub() as stub:
        main(["eval", "gpqa", "--url", stub.url, ...])
        stub.authorizations  # ["Basic dXNlcjpwYXNz", ...]
    with openai_stub({"POST /v1/chat/completions": (200, b"[1, 2]")}) as stub: ...
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL = "tiny-deepseek"
HANG = "hang"
"""An answer that never comes: the stub holds the request until the server stops."""
Answer = tuple[int, bytes] | Callable[[str], tuple[int, bytes]] | str
STREAM = (Path(__file__).parent / "fixtures" / "bench" / "sse_chat_ok.txt").read_bytes()
ANSWER = {
    "id": "chatcmpl-stub",
    "object": "chat.completion",
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ANSWER: A"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
}


@dataclass
class Stub:
    port: int
    authorizations: list[str] = field(default_factory=list)
    bodies: list[dict] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def openai_stub(answers: dict[str, Answer] | None = None) -> Iterator[Stub]:
    """Serve until the block ends."""
    stub = Stub(port=0)
    answers = answers or {}
    stopping = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # why: tests/eval/fake_vllm.py's Handler

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            stub.authorizations.append(self.headers.get("Authorization", ""))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _answered(self, method: str) -> bool:
            """Answer from ``answers`` when it names this route."""
            answer = answers.get(f"{method} {self.path}")
            if answer is None:
                return False
            if answer == HANG:
                stopping.wait(60)
                return True
            status, body = (
                answer(self.headers.get("Authorization", "")) if callable(answer) else answer
            )
            self._send(status, body)  # type: ignore[arg-type]
            return True

        def do_GET(self) -> None:
            if self._answered("GET"):
                return
            if self.path == "/v1/models":
                models = {
                    "object": "list",
                    "data": [{"id": MODEL, "object": "model", "max_model_len": 2048}],
                }
                self._send(200, json.dumps(models).encode())
            elif self.path == "/version":
                self._send(200, b'{"version": "0.0.stub"}')
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self._answered("POST"):
                return
            if self.path != "/v1/chat/completions":
                self._send(404, b'{"error": "not found"}')
                return
            stub.bodies.append(body)
            if body.get("stream"):
                self._send(200, STREAM, "text/event-stream")
            else:
                self._send(200, json.dumps(ANSWER).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stub.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()
