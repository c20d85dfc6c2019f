"""The response log: one JSON line per finished request, appended and fsync-ed, so a crash loses
at most the requests in flight.

Layout of ``responses.jsonl``::

    {"kind": "header", "protocol": {...}, "protocol_hash": "...", ...}   line 1, once
    {"kind": "session", "index": 0, "started_at": ...}                   each start or resume
    {"kind": "sample", "key": "...", "record_id": ..., "response": {...}, "fallback": {...}, ...}

A sample's ``key`` is the SHA-256 of the endpoint, model, sampling parameters, the prompt, the
option permutation, the record id and the repeat index (``sample_key``): anything that changes
what is asked changes the key. ``--resume`` skips samples whose key is in the log, and refuses a
log whose header names another model, endpoint, data set or protocol (``open_log``). A line cut
short by a crash is dropped when the log is reopened.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tandem.errors import Problem, SpecError
from tandem.eval.client import ChatResponse

SCHEMA_VERSION = 1
LOG_NAME = "responses.jsonl"


def canonical_hash(value: Any) -> str:
    """SHA-256 of the canonical JSON of a value (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class SamplingParams(BaseModel):
    """What is sent with every request besides the messages."""

    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature.")
    max_tokens: int = Field(default=32768, ge=1, description="max_tokens of every request.")
    top_p: float | None = Field(
        default=None, gt=0, le=1, description="Nucleus sampling; default: the server's."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=lambda: {"thinking": True},
        description="Sent as chat_template_kwargs (thinking on).",
    )

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return body


class Protocol(BaseModel):
    """Everything that decides what the endpoint is asked. Two runs with equal protocols may
    share a log; the header stores it and ``--resume`` compares it field by field."""

    endpoint: str
    model: str
    dataset_sha256: str
    seed: int = 0
    template: str
    sampling: SamplingParams
    fallback: bool = True
    fallback_sampling: SamplingParams
    fallback_context_chars: int = 4000

    def digest(self) -> str:
        return canonical_hash(self.model_dump(mode="json"))


class HeaderRecord(BaseModel):
    kind: Literal["header"] = "header"
    schema_version: int = SCHEMA_VERSION
    protocol: Protocol
    protocol_hash: str
    dataset_path: str
    created_at: float


class SessionRecord(BaseModel):
    kind: Literal["session"] = "session"
    index: int
    started_at: float
    resumed: bool = False


class ResponseRecord(ChatResponse):
    """One chat response as saved: the response itself (``raw_content`` keeps what the server
    sent, so the answer can be re-extracted without asking again) and the extracted letter."""

    letter: str | None = None
    rule: str = "none"


class SampleRecord(BaseModel):
    kind: Literal["sample"] = "sample"
    key: str
    record_id: str
    repeat: int
    domain: str
    subdomain: str
    permutation: list[int]
    correct_letter: str
    prompt: str
    response: ResponseRecord
    fallback: ResponseRecord | None = None
    session: int = 0
    finished_at: float


def sample_key(
    protocol: Protocol,
    *,
    prompt: str,
    permutation: list[int] | tuple[int, ...],
    record_id: str,
    repeat: int,
) -> str:
    """The identity of one request: endpoint, model, sampling, prompt, permutation, id, repeat."""
    return canonical_hash(
        {
            "endpoint": protocol.endpoint,
            "model": protocol.model,
            "sampling": protocol.sampling.model_dump(mode="json"),
            "prompt": prompt,
            "permutation": list(permutation),
            "record_id": record_id,
            "repeat": repeat,
        }
    )


class LogContents(BaseModel):
    header: HeaderRecord
    sessions: list[SessionRecord] = Field(default_factory=list)
    samples: list[SampleRecord] = Field(default_factory=list)


def read_log(path: str | Path) -> LogContents:
    """Parse a response log; a last line cut short by a crash is ignored.

    Raises:
        SpecError: the file is missing, has no header, or a complete line is not a record.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(
            f"cannot read the response log: {exc.strerror or exc}",
            file=str(path),
            hint="pass the responses.jsonl an eval run wrote",
        ) from exc
    complete = data[: data.rfind(b"\n") + 1]
    header: HeaderRecord | None = None
    contents: LogContents | None = None
    for number, line in enumerate(complete.decode().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind = record.get("kind")
            if number == 1 or header is None:
                header = HeaderRecord.model_validate(record)
                contents = LogContents(header=header)
            elif kind == "session":
                contents.sessions.append(SessionRecord.model_validate(record))  # type: ignore[union-attr]
            elif kind == "sample":
                contents.samples.append(SampleRecord.model_validate(record))  # type: ignore[union-attr]
            else:
                raise ValueError(f"unknown record kind {kind!r}")
        except ValueError as exc:
            raise SpecError(
                f"line {number} is not a tandem eval record: {str(exc)[:300]}",
                file=str(path),
                hint="point at a responses.jsonl written by "
                "`tandem eval gpqa`, or start a new run in another --out",
            ) from exc
    if contents is None:
        raise SpecError(
            "the response log is empty", file=str(path), hint="start a new run without --resume"
        )
    return contents


class ResponseLog:
    """An open response log that finished samples are appended to.

    Usage:
        log = ResponseLog.open(out_dir / "responses.jsonl", protocol, dataset_path, resume=True)
        if key not in log.done: ...; log.append(record)
    """

    def __init__(self, path: Path, contents: LogContents) -> None:
        self.path = path
        self.header = contents.header
        self.done: dict[str, SampleRecord] = {s.key: s for s in contents.samples}
        self.session = len(contents.sessions)
        self._file = path.open("ab")

    @classmethod
    def open(
        cls, path: str | Path, protocol: Protocol, dataset_path: str, *, resume: bool, now: float
    ) -> ResponseLog:
        """Create a log, or reopen one to resume; starts a new session either way.

        Raises:
            SpecError: the log exists and ``resume`` is off, or it was written for another
                model, endpoint, data set or protocol (every differing field is listed).
        """
        path = Path(path)
        if path.exists() and path.stat().st_size > 0:
            if not resume:
                raise SpecError(
                    "a response log already exists here",
                    file=str(path),
                    hint="pass --resume to continue it, or choose another --out",
                )
            contents = read_log(path)
            _check_same_protocol(path, contents.header.protocol, protocol)
            _drop_partial_line(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            header = HeaderRecord(
                protocol=protocol,
                protocol_hash=protocol.digest(),
                dataset_path=dataset_path,
                created_at=now,
            )
            contents = LogContents(header=header)
            _append_line(path, header.model_dump_json(), create=True)
        log = cls(path, contents)
        log._write(SessionRecord(index=log.session, started_at=now, resumed=bool(log.done)))
        return log

    def append(self, record: SampleRecord) -> None:
        """Write one finished sample and force it to disk before returning."""
        record.session = self.session
        self._write(record)
        self.done[record.key] = record

    def close(self) -> None:
        self._file.close()

    def _write(self, record: BaseModel) -> None:
        self._file.write(record.model_dump_json().encode() + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())


def _append_line(path: Path, line: str, *, create: bool = False) -> None:
    with path.open("xb" if create else "ab") as handle:
        handle.write(line.encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def _drop_partial_line(path: Path) -> None:
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep != len(data):
        with path.open("r+b") as handle:
            handle.truncate(keep)
            os.fsync(handle.fileno())


def _check_same_protocol(path: Path, logged: Protocol, current: Protocol) -> None:
    if logged.digest() == current.digest():
        return
    problems = [
        Problem(f"protocol.{name}", f"the log has {_short(old)}, this run {_short(new)}")
        for name, old, new in _differences(
            logged.model_dump(mode="json"), current.model_dump(mode="json")
        )
    ]
    raise SpecError(
        "the response log was written for another model or protocol; resuming "
        "would mix two evaluations",
        file=str(path),
        problems=problems,
        hint="use the same endpoint, model, CSV and options as the logged run, or "
        "start a new run in another --out",
    )


def _differences(old: dict, new: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    found = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differences(a, b, f"{prefix}{name}.")
        elif a != b:
            found.append((prefix + name, a, b))
    return found


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
