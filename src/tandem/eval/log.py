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
short by a crash is dropped when the log is reopened. Every line goes through ``tandem.files``
(redacted: a response may quote a key); the header's endpoint is already without a password.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, Field, TypeAdapter

from tandem import files, ownership
from tandem.errors import Problem, SpecError
from tandem.eval.client import ChatResponse
from tandem.jsonfiles import differences, read_jsonl
from tandem.redact import Redactor

SCHEMA_VERSION = 1
LOG_NAME = "responses.jsonl"


def _holds_a_log(folder: Path) -> bool:
    """A ``responses.jsonl`` whose first line is a log's header: the folder of a GPQA run."""
    try:
        with (folder / LOG_NAME).open(encoding="utf-8") as log:
            return json.loads(log.readline()).get("kind") == "header"
    except (OSError, ValueError, AttributeError):
        return False


RUN = ownership.RunKind("eval gpqa", "a GPQA evaluation", is_own=_holds_a_log)
"""A GPQA run's ``--out`` folder: identified by its endpoint, seed and sampling (``identity``
in ``tandem.cli.eval``); the log's header checks the rest when it is resumed."""


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


_RECORD: TypeAdapter[HeaderRecord | SessionRecord | SampleRecord] = TypeAdapter(
    Annotated[HeaderRecord | SessionRecord | SampleRecord, Field(discriminator="kind")]
)


def read_log(path: str | Path) -> LogContents:
    """Parse a response log; a last line cut short by a crash is ignored.

    Raises:
        SpecError: the file is missing or unreadable (a gzip'ed copy), has no header first, or
            a complete line is not a record (named by its number; a log that is resumed and
            rescored must be whole).
    """
    path = Path(path)
    first = True

    def record(value: Any) -> HeaderRecord | SessionRecord | SampleRecord:
        nonlocal first
        parsed = _RECORD.validate_python(value)
        if isinstance(parsed, HeaderRecord) != first:
            raise ValueError("the header must be the first record, and the only one")
        first = False
        return parsed

    records = read_jsonl(
        path,
        record,
        what="tandem eval record",
        kind="response log",
        hint="point at a responses.jsonl written by `tandem eval gpqa` (not compressed), "
        "or start a new run in another --out",
        strict=True,
    ).records
    if not records:
        raise SpecError(
            "the response log is empty", file=str(path), hint="start a new run without --resume"
        )
    header, *rest = records
    return LogContents(
        header=cast(HeaderRecord, header),  # record() refuses any other first
        sessions=[r for r in rest if isinstance(r, SessionRecord)],
        samples=[r for r in rest if isinstance(r, SampleRecord)],
    )


class ResponseLog:
    """An open response log that finished samples are appended to.

    Usage:
        log = ResponseLog.open(out_dir / "responses.jsonl", protocol, dataset_path, resume=True)
        if key not in log.done: ...; log.append(record)
    """

    def __init__(self, path: Path, contents: LogContents, redactor: Redactor) -> None:
        self.path = path
        self.done: dict[str, SampleRecord] = {s.key: s for s in contents.samples}
        self.session = len(contents.sessions)
        self._file = files.LineLog(path, redactor=redactor, fsync=True)

    @classmethod
    def open(
        cls,
        path: str | Path,
        protocol: Protocol,
        dataset_path: str,
        *,
        resume: bool,
        now: float,
        redactor: Redactor | None = None,
        claim: ownership.Claim | None = None,
    ) -> ResponseLog:
        """Create a log, or reopen one to resume; starts a new session either way.

        ``redactor``: the one every line goes through (default: the caller's); the runner's
        also knows a key given as ``--api-key``. ``claim``: the folder as the command claimed
        it before any request (created with its run mark with the log); without one the
        folder is created with a plain mark.

        Raises:
            SpecError: the log exists and ``resume`` is off, or it was written for another
                model, endpoint, data set or protocol (every differing field is listed).
        """
        path = Path(path)
        redactor = redactor or Redactor.for_caller()
        if path.exists() and path.stat().st_size > 0:
            if not resume:
                raise SpecError(
                    "a response log already exists here",
                    file=str(path),
                    hint="pass --resume to continue it, or choose another --out",
                )
            contents = read_log(path)
            _check_same_protocol(path, contents.header.protocol, protocol)
            files.cut_torn_line(path)
        else:
            # the command checked the folder before any request; created and marked now
            if claim is not None:
                claim.make()
            else:
                ownership.output_folder(path.parent, force=True)
            header = HeaderRecord(
                protocol=protocol,
                protocol_hash=protocol.digest(),
                dataset_path=dataset_path,
                created_at=now,
            )
            contents = LogContents(header=header)
            with files.LineLog(path, redactor=redactor, fsync=True, new=True) as new:
                new.write_json(header)
        log = cls(path, contents, redactor)
        log._file.write_json(
            SessionRecord(index=log.session, started_at=now, resumed=bool(log.done))
        )
        return log

    def append(self, record: SampleRecord) -> None:
        """Write one finished sample and force it to disk before returning."""
        record.session = self.session
        self._file.write_json(record)
        self.done[record.key] = record

    def close(self) -> None:
        self._file.close()


def _check_same_protocol(path: Path, logged: Protocol, current: Protocol) -> None:
    if logged.digest() == current.digest():
        return
    problems = [
        Problem(field, f"the log has {_short(old)}, this run {_short(new)}")
        for field, old, new in differences(
            logged.model_dump(mode="json"), current.model_dump(mode="json"), "protocol"
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


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
