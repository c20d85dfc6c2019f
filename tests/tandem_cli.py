"""The ``tandem`` command as the tests run it: a process of its own, on this venv's Python.

A test that is about what a user's shell sees (exit status, stderr, signals, what a process
leaves behind) runs this; one that only needs the command's output may use the in-process
``tandem_here`` fixture of ``conftest.py`` instead, which skips the interpreter's start-up.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TANDEM = [sys.executable, "-m", "tandem.cli"]
RECIPES = Path(__file__).resolve().parents[1] / "src/tandem/recipes"


def run_tandem(
    *args: str, env: dict[str, str], timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``tandem ARGS`` with exactly ``env``, its output captured as text."""
    return subprocess.run(
        [*TANDEM, *args], env=env, capture_output=True, text=True, timeout=timeout, check=check
    )


def spawn_tandem(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """``tandem ARGS`` started in the background with exactly ``env``, stdout and stderr as one
    text pipe (a supervisor, a watcher, a page the test stops itself)."""
    return subprocess.Popen(
        [*TANDEM, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def edited(text: str, *changes: tuple[str, str]) -> str:
    """``text`` with each ``(old, new)`` replaced once; an ``old`` that is not there fails the
    test's setup (the shipped recipe it edits has changed)."""
    for old, new in changes:
        assert old in text, f"{old!r} is no longer in the file the test edits"
        text = text.replace(old, new, 1)
    return text


@contextmanager
def deployed(recipe: Path, cluster: Path, name: str, env: dict[str, str]) -> Iterator[str]:
    """``tandem up RECIPE --cluster CLUSTER`` for the block (its failure fails the test with
    what it printed), then ``tandem down NAME`` whatever happened; yields what ``up`` printed."""
    up = run_tandem("up", str(recipe), "--cluster", str(cluster), env=env, timeout=900, check=False)
    try:
        if up.returncode:
            pytest.fail(f"tandem up {name} failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
        yield up.stdout
    finally:
        run_tandem("down", name, env=env, timeout=300, check=False)


def replicas_recipe(name: str, port: int, metrics_port: int) -> str:
    """The built-in ``smollm2-replicas`` as deployment ``name``, its router on ``port`` and
    ``metrics_port`` (each module its own, so that no two collide)."""
    return edited(
        (RECIPES / "smollm2-replicas.yaml").read_text(),
        ("name: smollm2-replicas", f"name: {name}"),
        ("  port: 8100", f"  port: {port}"),
        ("  metrics_port: 8190", f"  metrics_port: {metrics_port}"),
    )
