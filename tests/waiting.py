"""Waiting in the tests that run real servers: ask a condition until it holds, and fail saying
what was awaited (and what the servers said meanwhile), not with a bare timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx
import pytest

T = TypeVar("T")

NOT_YET = (httpx.HTTPError, KeyError, ValueError)
"""A server that does not answer yet, or has no such series or field yet."""


def until(
    what: str,
    check: Callable[[], T],
    timeout_s: float,
    *,
    every_s: float = 1.0,
    not_yet: tuple[type[BaseException], ...] = (),
    explain: Callable[[], str] | None = None,
) -> T:
    """``check()``'s first true value, asked every ``every_s``. After ``timeout_s`` the test
    fails naming ``what``, with what ``explain()`` returns. An exception of a type in
    ``not_yet`` (a server that does not answer yet) counts as false."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = check()
            if found:
                return found
        except not_yet:
            pass
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout_s:.0f} s waiting for {what}"
                + (f": {explain()}" if explain else "")
            )
        time.sleep(every_s)
