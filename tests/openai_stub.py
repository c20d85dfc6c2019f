"""A stub OpenAI-compatible server on 127.0.0.1, for tests of what a client run writes and prints.

It lists one model, answers a chat completion with ``ANSWER: A`` (JSON, or the recorded vLLM
stream of ``fixtures/bench/sse_chat_ok.txt`` when ``stream`` is asked), has no ``/metrics``, and
keeps the ``Authorization`` header of every request, so a test can see what credentials arrived,
and the body of every chat completion, so it can see what was asked.
It is a real socket (the bench sends through aiohttp, eval through httpx).

Usage:
    with openai_stub() as stub:
        main(["eval", "gpqa", "--url", stub.url, ...])
        stub.authorizations  # ["Basic dXNlcjpwYXNz", ...]
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL = "tiny-deepseek"
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
def openai_stub() -> Iterator[Stub]:
    """Serve until the block ends."""
    stub = Stub(port=0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            stub.authorizations.append(self.headers.get("Authorization", ""))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
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
        server.shutdown()
        server.server_close()
