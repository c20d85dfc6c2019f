"""The raw record of one benchmark request, and why a request failed.

One ``RequestRecord`` per request is appended to ``requests.jsonl`` as soon as the request ends,
so a killed run keeps everything it measured. Every aggregate in ``tandem.bench.metrics`` is a
pure function of these records; nothing is measured twice.

Times are seconds. ``start_s`` and ``scheduled_s`` are offsets from the start of the load point
(the clock the runner was given); every other time is an offset from ``start_s``, the moment the
request was handed to the HTTP client.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class ErrorCategory(StrEnum):
    """Why a request counts as failed. The value is what ``requests.jsonl`` holds.

    - ``http-status``: the server answered with a non-2xx status (e.g. 400 for a too long prompt).
    - ``sse-error``: the stream carried an error event (``event: error`` or ``data: {"error": …}``).
    - ``empty``: the stream ended cleanly but carried no token.
    - ``truncated``: the stream broke off before ``data: [DONE]`` (server died, connection reset).
    - ``timeout``: no complete answer within ``request_timeout_s``.
    - ``connection``: the server could not be reached (refused, DNS, TLS).
    - ``protocol``: the server sent something that is not an OpenAI stream (bad JSON, no SSE).
    """

    HTTP_STATUS = "http-status"
    SSE_ERROR = "sse-error"
    EMPTY = "empty"
    TRUNCATED = "truncated"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    PROTOCOL = "protocol"


class RequestRecord(BaseModel):
    """What one request did, measured on the client. Written as one JSON line.

    Usage:
        record = RequestRecord.model_validate_json(line)
        if record.ok:
            print(record.ttft_s, record.output_tokens)
    """

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="Position of the request in its load point, from 0.")
    load_point: str = Field(description="Label of the load point, e.g. `c4` or `r2.0`.")
    round: int = Field(default=1, description="Which round of the run (`--rounds`), from 1.")
    conversation: int | None = Field(
        default=None, description="The conversation it is a turn of (multi-turn runs)."
    )
    turn: int | None = Field(
        default=None, description="Its turn in that conversation, from 1 (multi-turn runs)."
    )
    prefix_group: int | None = Field(
        default=None, description="The shared prefix it starts with (shared-prefix runs)."
    )
    endpoint: str = Field(description="`chat` (/v1/chat/completions) or `completions`.")
    scheduled_s: float = Field(
        description="When the arrival schedule wanted the request sent, from the load point start."
    )
    start_s: float = Field(
        description="When it was sent, from the load point start. `start_s - scheduled_s` is the "
        "client queue time (waiting for a concurrency slot or for the event loop)."
    )
    ok: bool = Field(description="True when the stream finished and carried at least one token.")
    error: ErrorCategory | None = Field(default=None, description="Why it failed; None when ok.")
    error_detail: str | None = Field(
        default=None, description="The server's message or the exception text, shortened."
    )
    http_status: int | None = Field(default=None, description="HTTP status of the response.")
    ttft_s: float | None = Field(
        default=None, description="Time to first token of any kind (reasoning or answer)."
    )
    ttfat_s: float | None = Field(
        default=None,
        description="Time to first answer token: the first non-reasoning content. "
        "Equals ttft_s for a model that does not reason.",
    )
    e2el_s: float | None = Field(
        default=None,
        description="End-to-end latency: arrival of the last token chunk. The "
        "trailing usage chunk and `[DONE]` are not counted.",
    )
    chunk_times_s: list[float] = Field(
        default_factory=list,
        description="Arrival time of every token-bearing chunk, from start_s. The inter-chunk "
        "gaps (ITL) are the differences of consecutive entries.",
    )
    reasoning_chunks: int = Field(default=0, description="How many chunks carried reasoning text.")
    prompt_tokens: int | None = Field(default=None, description="`usage.prompt_tokens`.")
    output_tokens: int | None = Field(
        default=None,
        description="`usage.completion_tokens` (includes reasoning tokens); when "
        "the server sends no usage, the number of token chunks.",
    )
    output_tokens_from_usage: bool = Field(
        default=True, description="False when output_tokens was counted from chunks."
    )
    reasoning_tokens: int | None = Field(
        default=None, description="`usage.completion_tokens_details.reasoning_tokens`, if sent."
    )
    finish_reason: str | None = Field(default=None, description="`length`, `stop`, …")
    output_chars: int = Field(default=0, description="Characters of answer text received.")
    reasoning_chars: int = Field(default=0, description="Characters of reasoning text received.")

    @property
    def chunks(self) -> int:
        """Token-bearing chunks received."""
        return len(self.chunk_times_s)

    @property
    def queue_s(self) -> float:
        """Client queue time: how long the request waited on the client before it was sent."""
        return max(0.0, self.start_s - self.scheduled_s)
