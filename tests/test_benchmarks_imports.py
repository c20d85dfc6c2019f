"""The benchmark scripts run by hand, often on another machine (``benchmarks/gpu/``), so no test
runs them; what they take from tandem must still exist. A rename in ``src`` that leaves a
script importing an old name fails here, not on the GPU host."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def tandem_imports(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` for each ``from tandem... import name`` and ``import tandem...``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tandem":
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "tandem"]
    return found


@pytest.mark.parametrize(
    "script", sorted(BENCHMARKS.rglob("*.py")), ids=lambda p: str(p.relative_to(BENCHMARKS))
)
def test_every_name_a_benchmark_takes_from_tandem_exists(script: Path):
    missing = []
    for module, name in tandem_imports(script):
        loaded = importlib.import_module(module)
        if name is not None and not hasattr(loaded, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script.name} imports names tandem no longer has: {missing}"
