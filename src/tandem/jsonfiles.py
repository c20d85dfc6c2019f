"""Reading the JSON and JSONL files tandem saved or the user gave: one error edge for all.

``samples.jsonl``, ``requests.jsonl``, ``responses.jsonl``, ``summary.json``, ``watch.json`` and
``state.json`` are read back by reports, resumes and comparisons, often files a user copied,
edited or compressed. Every such read goes through ``read_json`` or ``read_jsonl``, so a file
that cannot be used (missing, a folder, not UTF-8 as a gzip'ed copy, not JSON, not the record
expected) is one ``TandemError`` naming the file, the line and the fix, never a traceback.

A JSONL file is appended one flushed line at a time, so a writer killed mid-line leaves a torn
last line (no newline): it is skipped and reported as ``torn``. A complete line that is not a
record while others are (a disk fault, a hand edit) is counted in ``damaged`` by its number, so
a report can show what it did not judge; a file with no record but damaged lines is refused.

The writing counterpart is ``tandem.files``.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from tandem.errors import SpecError, TandemError

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
_NOT_TEXT = "not UTF-8 text (a compressed or binary file?)"


@dataclass(frozen=True)
class JsonLines(Generic[T]):
    """The records of a JSONL file, and the lines that were not records.

    Usage:
        read = read_jsonl(path, Sample.model_validate, what="watch sample", hint="...")
        read.records; read.damaged  # [7, 12]: line numbers skipped
    """

    records: list[T] = field(default_factory=list)
    damaged: list[int] = field(default_factory=list)
    """Numbers (from 1) of complete lines that were not records; they are not in ``records``."""
    torn: bool = False
    """The last line had no newline (a writer killed mid-line) and was skipped."""

    @property
    def skipped_note(self) -> str:
        """What was skipped, for a report line; empty when nothing was."""
        parts = []
        if self.damaged:
            shown = ", ".join(map(str, self.damaged[:10])) + (
                ", ..." if len(self.damaged) > 10 else ""
            )
            parts.append(f"{len(self.damaged)} damaged line(s) skipped (line {shown})")
        if self.torn:
            parts.append("a torn last line skipped (a writer killed mid-line)")
        return "; ".join(parts)


def read_jsonl(
    path: str | Path,
    parse: Callable[[Any], T],
    *,
    what: str,
    hint: str,
    error: type[TandemError] = SpecError,
    strict: bool = False,
    kind: str | None = None,
    torn_last_line: bool = True,
) -> JsonLines[T]:
    """Every record of the JSONL file ``path``, each line's JSON value passed to ``parse``
    (a model's ``model_validate``; it raises ``ValueError``, as ``ValidationError`` is, for a
    value that is no record). A missing file is an error; ask ``path.exists()`` first where an
    absent file means no records.

    Args:
        what: one record in words, for messages (``watch sample``).
        hint: how to fix an unusable file (which file to pass, or to start anew).
        error: ``SpecError`` for a file the user gave, ``StateError`` for tandem's own state.
        strict: refuse the first damaged line instead of counting it (a log that is resumed).
        kind: the file in words (``response log``); default "``what`` file".
        torn_last_line: an unterminated last line is a writer killed mid-line (skipped); False
            for a file a person wrote, whose last line is a record that lacks its newline.

    Raises:
        error: the file cannot be read, has damaged lines but no record, or (``strict``) has
            a damaged line.
    """
    path = Path(path)
    fail = partial(error, file=str(path), hint=hint)
    records: list[T] = []
    damaged: list[int] = []
    first_fault = ""
    torn = False
    try:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    if torn_last_line and not raw.endswith(b"\n"):
                        _check_torn(raw)
                        torn = True
                    elif raw.strip():
                        records.append(_parse_line(raw, parse, what))
                except _Damaged as fault:
                    if strict:
                        raise fail(f"line {number}: {fault}") from None
                    damaged.append(number)
                    first_fault = first_fault or f"line {number}: {fault}"
    except OSError as exc:
        raise fail(f"cannot read the {kind or what + ' file'}: {exc.strerror or exc}") from exc
    if damaged and not records:
        raise fail(f"no line is a {what} ({len(damaged)} damaged); {first_fault}")
    return JsonLines(records, damaged, torn)


def read_json(
    path: str | Path,
    model: type[M],
    *,
    what: str,
    hint: str,
    error: type[TandemError] = SpecError,
) -> M:
    """The JSON file ``path`` as ``model``.

    Raises:
        error: the file cannot be read, is not UTF-8 JSON (naming the line), or is not a
            ``what`` (naming the field).
    """
    path = Path(path)
    fail = partial(error, file=str(path), hint=hint)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot read the {what}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise fail(f"line {line}: {_NOT_TEXT}") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"line {exc.lineno}: not JSON: {exc.msg}") from exc
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise fail(f"not a {what}: {validation_text(exc)}") from exc


def validation_text(exc: ValidationError) -> str:
    """The first fault of a ``ValidationError`` as ``field.path: message`` (and how many more)."""
    errors = exc.errors()
    if not errors:
        return str(exc).splitlines()[0]
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    text = f"{where}: {first['msg']}" if where else first["msg"]
    return text + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")


def differences(a: Any, b: Any, path: str) -> list[tuple[str, Any, Any]]:
    """Where two saved JSON values differ: ``(dotted path, old, new)`` of each leaf, the paths
    below ``path`` in key order (a key one side lacks is None there)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            change
            for key in sorted(set(a) | set(b), key=str)
            for change in differences(a.get(key), b.get(key), f"{path}.{key}")
        ]
    return [] if a == b else [(path, a, b)]


class _Damaged(Exception):
    """Why a line is not a record (the message)."""


def _parse_line(raw: bytes, parse: Callable[[Any], T], what: str) -> T:
    """The record of one complete line.

    Raises:
        _Damaged: it is not UTF-8, not JSON, or not a record.
    """
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _Damaged(_NOT_TEXT) from None
    except json.JSONDecodeError as exc:
        raise _Damaged(f"not JSON: {exc.msg}") from None
    try:
        return parse(value)
    except ValidationError as exc:
        raise _Damaged(f"not a {what}: {validation_text(exc)}") from None
    except ValueError as exc:
        raise _Damaged(f"not a {what}: {str(exc)[:300]}") from None


def _check_torn(raw: bytes) -> None:
    """An unterminated last line is torn (a writer killed mid-line) unless it holds bytes no
    writer of UTF-8 text writes; a character cut in two at its end is still only torn.

    Raises:
        _Damaged: it is not UTF-8 text.
    """
    try:
        codecs.getincrementaldecoder("utf-8")().decode(raw, final=False)
    except UnicodeDecodeError:
        raise _Damaged(_NOT_TEXT) from None
