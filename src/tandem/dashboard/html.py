"""The small pieces every part of the page is written with: escaping, tiles, figures. Pure.

A tile that shows a value of the observation names where it comes from:
``data-path="groups.0.verdict"`` (dotted, into ``tandem status --json``) and
``data-value`` (that value as JSON), so a test can hold every such tile against the status the
page was drawn from. A figure that follows from several observations (a rate, a p95) carries
``data-derived`` instead.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import Any

NO_SAMPLE = "no sample"
NO_TRAFFIC = "no traffic"
NOTHING_TO_MEASURE = "none in window"
"""Traffic, but nothing this figure measures (no gap between tokens of 1-token requests)."""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def observed(path: str, value: Any, shown: str | None = None, *, cls: str = "") -> str:
    """A value of the observation, shown (``shown``, else the value) with where it came from."""
    text = shown if shown is not None else _plain(value)
    attrs = f' class="{esc(cls)}"' if cls else ""
    return (
        f'<span data-path="{esc(path)}" data-value="{esc(json.dumps(value))}"{attrs}>'
        f"{esc(text)}</span>"
    )


def _plain(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def tile(label: str, body: str, *, note: str = "", cls: str = "") -> str:
    return (
        f'<div class="tile {esc(cls)}"><div class="label">{esc(label)}</div>'
        f'<div class="value">{body}</div>'
        + (f'<div class="note">{esc(note)}</div>' if note else "")
        + "</div>"
    )


def derived(name: str, text: str, *, cls: str = "") -> str:
    return f'<span data-derived="{esc(name)}" class="{esc(cls)}">{esc(text)}</span>'


def ms(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def rate(value: float | None, unit: str) -> str | None:
    if value is None:
        return None
    return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"


def share(value: float | None) -> str | None:
    return None if value is None else f"{value * 100:.1f} %"


def gib(value: int | float | None) -> str:
    return "—" if value is None else f"{value / 1024**3:.1f} GiB"


def clock(when: datetime | None) -> str:
    return "never" if when is None else when.astimezone(UTC).strftime("%H:%M:%S UTC")


def ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "never"
    seconds = max(0.0, (now - when).total_seconds())
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago" if seconds < 5400 else f"{seconds / 3600:.1f} h ago"


def table(columns: list[str], rows: list[list[str]], *, cls: str = "") -> str:
    """Cells are HTML already (escaped by whoever made them)."""
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{body}</section>'
