"""The ``tandem`` command as the tests run it: a process of its own, on this venv's Python.

A test that is about what a user's shell sees (exit status, stderr, signals, what a process
leaves behind) runs this; one that only needs the command's output may use the in-process
``tandem_here`` fixture of ``conftest.py`` instead, which skips the interpreter's start-up.
"""

from __future__ import annotations

import subprocess
import sys

TANDEM = [sys.executable, "-m", "tandem.cli"]


def run_tandem(
    *args: str, env: dict[str, str], timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``tandem ARGS`` with exactly ``env``, its output captured as text."""
    return subprocess.run(
        [*TANDEM, *args], env=env, capture_output=True, text=True, timeout=timeout, check=check
    )
