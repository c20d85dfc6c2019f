"""Every import in ``tandem`` points down the layers of ARCHITECTURE.md, or is a known exception.

The layers, bottom to top (a module may import its own layer and the layers below it):

    foundation  errors, wire, redact,          names, errors and signal handling everything
                ownership, files, interrupts,  shares; what tandem may delete, overwrite and kill;
                                               the one writing path (redacted, atomic, private);
                agent,                         the stdlib-only node agent (facts, looks, liveness);
                vllm_metrics, vllm_log,        vLLM's /metrics names and parser; its boot log;
                hf_cache, version              the Hugging Face cache layout; tandem's version;
                jsonfiles,                     reading saved JSON/JSONL files, one error edge;
                built_models                   the models tandem builds and the command for each
    spec        spec/, recipes/                the user's input: models, loading, built-ins
    core        rankplan, caches, plan/,       the Deployment's pure functions (and the check
                render/, check/                rules)
    endpoint    endpoint                       the client of an OpenAI-compatible server
    readiness   readiness                      what "ready" means, read from logs and HTTP
    backends    backends/                      launching, state on disk, hosts, Kubernetes
    operations  operations/: lifecycle,        up / down / status of a deployment of one group
                preflight, health, supervisor, or several behind one router, the preflight,
                revisions                      health and gang restarts over any backend; what
                                               each up ran
    tools       bench/, eval/, watch/,         consumers of an endpoint or a model folder;
                report/, models/, upgrade,     the models tandem builds; an upgrade's gate
                dashboard                      (smoke and bench) and its rollback; the
                                               status page
    surface     cli/, the ``tandem`` package   the command line and the public API

Imports are read with ``ast`` from the source files, nothing is imported: ``import`` and
``from`` statements anywhere in a module (function-local ones too), and string constants that
name a tandem module (the ``"module:Name"`` registries loaded with ``importlib``, and
``importlib.import_module("tandem.plan")``), since those are imports a reader cannot see.

``KNOWN_UPWARD`` lists the arrows that run up, each with why; it is empty since issue 18 step 1
(review section 1.2's arrows: the boot-log types moved to ``vllm_log``, the preflight above the
backends). A new upward import fails ``test_no_new_import_points_up``; an entry whose arrow is
gone fails ``test_known_upward_imports_still_exist``, so the list stays the truth.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "tandem.errors",
            "tandem.wire",
            "tandem.redact",
            "tandem.ownership",
            "tandem.files",
            "tandem.interrupts",
            "tandem.agent",
            "tandem.vllm_metrics",
            "tandem.vllm_log",
            "tandem.hf_cache",
            "tandem.version",
            "tandem.jsonfiles",
            "tandem.built_models",
        ),
    ),
    ("spec", ("tandem.spec", "tandem.recipes")),
    ("core", ("tandem.rankplan", "tandem.caches", "tandem.plan", "tandem.render", "tandem.check")),
    ("endpoint", ("tandem.endpoint",)),
    ("readiness", ("tandem.readiness",)),
    ("backends", ("tandem.backends",)),
    ("operations", ("tandem.operations",)),
    (
        "tools",
        (
            "tandem.bench",
            "tandem.eval",
            "tandem.watch",
            "tandem.report",
            "tandem.models",
            "tandem.upgrade",
            "tandem.dashboard",
        ),
    ),
    ("surface", ("tandem.cli", "tandem")),
]
"""Layer name and the modules in it (a name covers its submodules; ``tandem`` alone is the
package's ``__init__``, the public API)."""

KNOWN_UPWARD: dict[tuple[str, str], str] = {}
"""Upward arrows of today (none), each with why it exists; none may be added."""

_DOTTED = re.compile(r"tandem(\.\w+)+")


def module_files() -> dict[str, Path]:
    """Module name -> source file, for every module of the package."""
    found = {}
    for path in sorted((SRC / "tandem").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = module_files()


def imported_modules(module: str, source: str, known: set[str]) -> set[str]:
    """The tandem modules that ``module`` imports (or names as an import string) in ``source``."""
    is_package = MODULES.get(module, Path()).name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from tandem import wire` imports the module tandem.wire, not the package
            subs = {f"{base}.{alias.name}" for alias in node.names} & known
            found |= subs or {base}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.partition(":")[0]
            if _DOTTED.fullmatch(name) and name in known:
                found.add(name)
    return {name for name in found if name in known and name != module}


def layer_of(module: str) -> int:
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if module == member or (member != "tandem" and module.startswith(member + ".")):
                return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")


def import_graph() -> dict[str, set[str]]:
    known = set(MODULES)
    return {
        module: imported_modules(module, path.read_text(), known)
        for module, path in MODULES.items()
    }


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (src, dst)
        for src, targets in graph.items()
        for dst in targets
        if layer_of(dst) > layer_of(src)
    }


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


def test_no_new_import_points_up(graph):
    new = {
        arrow: f"{LAYERS[layer_of(arrow[0])][0]} -> {LAYERS[layer_of(arrow[1])][0]}"
        for arrow in upward(graph) - set(KNOWN_UPWARD)
    }
    assert new == {}, "imports that run from a lower layer to a higher one"


def test_known_upward_imports_still_exist(graph):
    gone = set(KNOWN_UPWARD) - upward(graph)
    assert gone == set(), "fixed: remove these from KNOWN_UPWARD"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from tandem import wire", {"tandem.wire"}),
        ("from tandem.backends.state import BootFigures", {"tandem.backends.state"}),
        ("import tandem.cli", {"tandem.cli"}),
        ("def f():\n    from ...cli import main", {"tandem.cli"}),
        (
            "TRANSPORTS = {'ssh': 'tandem.backends.ssh_check:SSHNodeTransport'}",
            {"tandem.backends.ssh_check"},
        ),
        ("LABEL = 'tandem.deployment'", set()),  # a label, not a module
    ],
    ids=[
        "from the package",
        "from a module",
        "plain import",
        "relative, inside a function",
        "a registry string",
        "a string that names no module",
    ],
)
def test_imports_are_read_from_the_source(source, expected):
    assert imported_modules("tandem.check.rules", source, set(MODULES)) == expected


def test_an_upward_import_is_caught():
    graph = {
        "tandem.errors": imported_modules(
            "tandem.errors", "from tandem.cli import main", set(MODULES)
        )
    }
    assert upward(graph) == {("tandem.errors", "tandem.cli")}
