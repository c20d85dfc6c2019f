"""The one writing path: every file and line tandem writes goes through here, redacted.

A secret that reaches a writer (an ``events.log`` line copied into a watch sample, a URL with a
password in a report, a token in a rendered command) is hidden by the writing itself, not by
each writer remembering to: ``write_text``, ``write_json`` and ``LineLog`` pass every text
through a ``Redactor`` (``tandem.redact``) that knows the secret shapes and the caller's secret
values, plus any the caller adds (a ``--api-key`` given on the command line).

Besides redaction, this module knows how tandem writes:

- a whole file is replaced **atomically** (written beside it, then renamed), so a reader or a
  killed run never leaves half of one;
- a log or a JSONL file is **appended** a line at a time, flushed (and fsync-ed where a crash
  must lose nothing), so a torn last line is the worst a crash leaves;
- a deployment's files are **private** (folders 0700, files 0600): they hold its commands,
  addresses and logs.

What it does not write (``tests/test_files.py`` lists each module, with why, and fails on a new
one): the output of a child process (a rank's stdout goes to a file opened with
``open_private``; every reader of it redacts), ``/etc/tandem/*.env``, whose purpose is to hold
a key, the files of a model tandem makes (``models.tiny``), and what the stdlib-only scripts that
run on a node write there.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from pydantic import BaseModel

from tandem.redact import Redactor


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can enter (0700), created with its parents."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def open_private(path: Path, mode: str = "a") -> IO:
    """Open ``path`` for writing (``w``, ``a``, ``ab``, ``xb``...), created mode 0600 if new,
    and made 0600 if it was not; ``x`` refuses a file that exists. Nothing written through the
    handle is redacted: it is for what a child process writes (a rank's log, read back through
    a redactor by ``logs`` and the bundle)."""
    return _open(path, mode, private=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the private lock file ``path`` (its folder made private if
    new) until the block ends: one process at a time reads, changes and writes what it guards."""
    private_dir(path.parent)
    with open_private(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _open(path: Path, mode: str, *, private: bool) -> IO:
    """``path`` opened for ``mode``: private (0600), or of the user's umask (0666 masked), as a
    file in an output folder is."""
    flags = os.O_WRONLY | os.O_CREAT
    if "x" in mode:
        flags |= os.O_EXCL
    else:
        flags |= os.O_APPEND if "a" in mode else os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o666)
    if private:
        os.chmod(path, 0o600)
    mode = mode.replace("x", "w")
    return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8")


def _json_text(data: object, redactor: Redactor, *, indent: int | None = None) -> str:
    """``data`` as JSON, every string in it redacted (by shape and value; the keys of tandem's
    own records are not secret names: an eval sample's ``key`` is a hash)."""
    plain = json.loads(data.model_dump_json()) if isinstance(data, BaseModel) else data
    safe = redactor.data(plain, names=False)
    if indent is None:
        return json.dumps(safe, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(safe, ensure_ascii=False, indent=indent)


def write_text(
    path: Path, text: str, *, redactor: Redactor | None = None, private: bool = False
) -> Path:
    """Replace ``path`` atomically with ``text``, redacted; returns ``path``.

    Args:
        redactor: the caller's, when it knows secret values beyond the environment's
            (default: ``Redactor.for_caller()``).
        private: mode 0600, for a deployment's own files.

    Raises:
        OSError: the folder does not exist or cannot be written.
    """
    return _replace(path, (redactor or Redactor.for_caller()).text(text), private=private)


def write_json(
    path: Path,
    data: object,
    *,
    redactor: Redactor | None = None,
    private: bool = False,
    indent: int = 2,
) -> Path:
    """Replace ``path`` atomically with ``data`` (a JSON-like value or a pydantic model) as
    indented JSON and a newline, every string redacted; returns ``path``.

    Raises:
        OSError: the folder does not exist or cannot be written.
    """
    text = _json_text(data, redactor or Redactor.for_caller(), indent=indent)
    return _replace(path, text + "\n", private=private)


def write_jsonl(
    path: Path,
    items: Iterable[object],
    *,
    redactor: Redactor | None = None,
    private: bool = False,
) -> Path:
    """Replace ``path`` atomically with one compact JSON line per item, every string redacted
    (a JSONL file cut down to what a resumed run keeps); returns ``path``."""
    redactor = redactor or Redactor.for_caller()
    text = "".join(_json_text(item, redactor) + "\n" for item in items)
    return _replace(path, text, private=private)


def _replace(path: Path, safe: str, *, private: bool) -> Path:
    """Write ``safe`` (already redacted: JSON text must not be redacted twice, a value cut at
    an escaped quote would break it) beside ``path``, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with _open(tmp, "w", private=private) as handle:
            handle.write(safe)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def cut_torn_line(path: Path) -> None:
    """Cut a torn last line (a writer killed mid-line) off a JSONL file, forced to disk, so the
    lines appended next start clean; nothing when the file is whole or missing."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    keep = data.rfind(b"\n") + 1
    if keep != len(data):
        with path.open("r+b") as handle:
            handle.truncate(keep)
            os.fsync(handle.fileno())


class LineLog:
    """An append-only file of lines (a JSONL file, an events log), each redacted and flushed.

    Usage:
        with LineLog(folder / "samples.jsonl") as log:
            log.write_json(sample)          # one compact JSON line
            log.write("2026-01-01T00:00:00Z  restart 1/3 ...")

    Args:
        redactor: as for ``write_text``.
        private: mode 0600 (a deployment's own files).
        fsync: force every line to disk before ``write`` returns (a log a crash must not lose).
        new: the file must not exist yet (``FileExistsError`` otherwise).
    """

    def __init__(
        self,
        path: Path,
        *,
        redactor: Redactor | None = None,
        private: bool = False,
        fsync: bool = False,
        new: bool = False,
    ) -> None:
        self.path = path
        self.redactor = redactor or Redactor.for_caller()
        self.fsync = fsync
        self._handle = _open(path, "x" if new else "a", private=private)

    def write(self, line: str) -> None:
        """Append ``line`` (without its newline), redacted."""
        self._append(self.redactor.text(line))

    def write_json(self, data: object) -> None:
        """Append ``data`` (a JSON-like value or a pydantic model) as one compact JSON line,
        every string redacted."""
        self._append(_json_text(data, self.redactor))

    def _append(self, safe: str) -> None:
        self._handle.write(safe + "\n")
        self._handle.flush()
        if self.fsync:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> LineLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_line(path: Path, line: str, *, private: bool = False) -> None:
    """Append one redacted line to ``path`` (an events log written now and then)."""
    with LineLog(path, private=private) as log:
        log.write(line)
