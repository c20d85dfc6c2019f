"""The one printing path: every line tandem shows on the terminal goes through here.

``tandem.files`` keeps secrets out of what tandem writes; this module does the same for what
it prints, at the one place printing happens, so no command has to remember to: a password in
``--url`` echoed in a smoke check's line, a server's error body that quotes the caller's key,
a revision restored from a backup that holds a token. Everything is redacted by
``tandem.redact`` (by name, by shape, and the caller's own secret values, those given as
``--api-key`` too), and a text's control characters (an escape sequence in a name, a carriage
return) are shown escaped, so a value cannot repaint or hide what the terminal shows.

- ``echo``: a line (or a block, ``--json`` output) as ``click.echo`` prints it;
- ``console``: a rich console for views, tables and progress, whose every write is redacted
  and whose printed texts are escaped before rich lays them out;
- ``shown``: one value as a message may quote it: escaped, and cut with its length said when
  it is long (a 60 MB field of a revision);
- ``log_handler``: the logging handler of tandem's loggers (a warning reaches stderr the same
  way).

``tests/test_printing.py`` reads every module with ``ast`` and fails on a ``print``, a
``click.echo``, a rich ``Console`` or a stream handler anywhere else.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from typing import IO, Any, cast

import click
from rich.console import Console

from tandem.redact import Redactor, redact_text

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Characters that move the cursor, erase, change colours or reorder text: everything of C0
and C1 but tab and newline, DEL, and Unicode's direction marks and overrides."""
SHOWN_CHARS = 200
"""The most of one value ``shown`` prints."""


def escaped(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``, ``\\u202e``)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def safe(text: str) -> str:
    """``text`` as tandem prints it: redacted, its control characters escaped."""
    return escaped(redact_text(text))


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """One value as a message quotes it: redacted, escaped, and cut at ``limit`` characters
    with its whole length said (``'abc... (60000000 characters)'``)."""
    text = safe(str(value))
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def echo(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    """Print ``text`` (redacted, escaped) on stdout, or stderr with ``err``."""
    click.echo(safe(text), err=err, nl=nl)


def echo_json(data: Any) -> None:
    """Print a JSON-like value as indented JSON, the values of secret-named keys hidden too
    (``HF_TOKEN: ...`` in a recipe's env)."""
    plain = json.loads(json.dumps(data, default=str))
    echo(json.dumps(Redactor.for_caller().data(plain), indent=2, ensure_ascii=False))


class _Redacted(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr``, looked up at every write (a test's capture, rich's
    live display, which proxies them), every text redacted on its way."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def _stream(self) -> Any:
        stream = getattr(sys, self._name)
        return getattr(stream, "rich_proxied_file", stream)  # rich's own proxy: its target

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return bool(self._stream.isatty())

    def fileno(self) -> int:
        return int(self._stream.fileno())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._stream, "encoding", None) or "utf-8")


out_stream = cast(IO[str], _Redacted("stdout"))
err_stream = cast(IO[str], _Redacted("stderr"))
"""stdout and stderr as tandem writes them: a text stream for whatever wants one (click's
usage errors, a log handler)."""


class _Console(Console):
    """A rich console whose texts are redacted and escaped before layout (a secret split by
    styling could pass a redaction of the rendered text) and whose output is redacted again
    as it is written (what a table or a progress bar renders)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(safe(o) if isinstance(o, str) else o for o in objects), **kwargs)

    def log(self, *objects: Any, **kwargs: Any) -> None:
        super().log(*(safe(o) if isinstance(o, str) else o for o in objects), **kwargs)


def console(*, stderr: bool = False, **options: Any) -> Console:
    """A rich console on stdout (or stderr), redacted; ``options`` are rich's (``highlight``,
    ``soft_wrap``, ``width``...).

    Usage:
        console = screen.console(highlight=False)
        console.print(f"[bold]{name}[/bold] is ready")
    """
    return _Console(file=err_stream if stderr else out_stream, **options)


def like(view: Console, **options: Any) -> Console:
    """A console writing where ``view`` writes, with other ``options`` (a wider one)."""
    return _Console(file=view.file, **options)


def log_handler() -> logging.Handler:
    """A handler that prints a log record's message on stderr, redacted and escaped."""
    handler = logging.StreamHandler(err_stream)
    handler.setFormatter(_SafeFormatter("%(message)s"))
    return handler


class _SafeFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return escaped(super().format(record))
