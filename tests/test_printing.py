"""Every line tandem prints goes through ``tandem.screen`` (issue 46, class 2).

The gate is of the layer test's kind: every module of the package is read with ``ast`` and a
way of printing that bypasses the one path is a failure: ``print``, ``click.echo`` (and
``secho``, ``get_text_stream``), a rich ``Console`` made anywhere but ``tandem.screen``, a rich
``Progress``, ``Live`` or ``Status`` made without the console it prints on (it would make its
own), ``sys.stdout``/``sys.stderr`` used directly, a logging stream handler or
``basicConfig``, ``os.write``. ``ALLOWED`` lists the modules that print otherwise, each with why.

Then the lines the audit found leaking, each shown redacted through the command itself.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tandem import screen
from tandem.operations import revisions
from tests.openai_stub import openai_stub

SRC = Path(__file__).parents[1] / "src" / "tandem"
ALLOWED = {
    "screen.py": "the one printing path",
    "agent.py": "the node agent: it runs on a node, and tandem reads its stdout as data",
    "check/allreduce.py": "the fabric test torchrun runs on the nodes; tandem reads its stdout",
}
PRINTING_CALLS = {"echo", "secho", "get_text_stream"}
"""``click``'s ways of writing to the terminal."""
NEEDS_CONSOLE = {"Progress", "Live", "Status"}


def bypasses(source: str) -> list[str]:
    """Each place in ``source`` that prints around ``tandem.screen``, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.ImportFrom) and node.module == "click":
            if PRINTING_CALLS & {a.name for a in node.names}:
                what = "imports click's echo"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "sys" and node.attr in ("stdout", "stderr", "__stdout__"):
                what = f"sys.{node.attr}"
        elif isinstance(node, ast.Call):
            what = _printing_call(node)
        if what:
            found.append(f"{node.lineno}: {what}")
    return found


def _printing_call(call: ast.Call) -> str | None:
    func = call.func
    name = (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else ""
    )
    owner = (
        func.value.id
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        else ""
    )
    if isinstance(func, ast.Name) and name == "print":
        return "print()"
    if owner == "click" and name in PRINTING_CALLS:
        return f"click.{name}()"
    if name == "Console":
        return "a rich Console made outside tandem.screen"
    if name in NEEDS_CONSOLE and "console" not in {k.arg for k in call.keywords}:
        return f"a rich {name} without console= (it makes its own)"
    if owner == "logging" and name in ("StreamHandler", "basicConfig"):
        return f"logging.{name}()"
    if owner == "os" and name == "write":
        return "os.write()"
    return None


def modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if str(p.relative_to(SRC)) not in ALLOWED)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_prints_around_the_one_path(path):
    assert bypasses(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "source",
    [
        "print(url)",
        "import click\nclick.echo(f'{summary}')",
        "from click import echo",
        "from rich.console import Console\nConsole(stderr=True).print(name)",
        "import sys\nsys.stderr.write(body)",
        "from rich.progress import Progress\nProgress()",
        "import logging\nlogging.getLogger('x').addHandler(logging.StreamHandler())",
    ],
)
def test_the_gate_fails_on_each_way_around(source):
    assert bypasses(source)


def test_the_gate_passes_the_one_path():
    source = (
        "from tandem import screen\nscreen.echo(text)\n"
        "console = screen.console(stderr=True)\nconsole.print(text)\n"
        "Progress(console=console)\n"
    )
    assert bypasses(source) == []


def test_the_allowed_modules_still_exist():
    assert all((SRC / name).is_file() for name in ALLOWED)


# --- what the screen does to a line --------------------------------------------------------------


def test_a_line_is_redacted_and_its_control_characters_escaped(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "key-of-the-caller-42")
    line = screen.safe("a\x1b[2J\rname\u202e key-of-the-caller-42 http://u:pw123456@h/")
    assert line == "a\\x1b[2J\\rname\\u202e REDACTED http://u:REDACTED@h/"
    assert screen.safe("tab\tand\nnewline") == "tab\tand\nnewline"


def test_a_long_value_is_cut_with_its_length_said():
    assert screen.shown("x" * 5000, 10) == "xxxxxxxxxx... (5000 characters)"
    assert screen.shown("short") == "short"


# --- the leaks the audit found ------------------------------------------------------------------

KEY = "key-of-the-caller-0123456789"
"""No credential shape: only the caller's own values can hide it (given as --api-key)."""
PASSWORD = "url-pass-9876543210"


def quoting_the_key(authorization: str) -> tuple[int, bytes]:
    """A server whose error body quotes the request's key back."""
    key = authorization.removeprefix("Bearer ")
    return 400, json.dumps({"error": f"bad request from the key {key}"}).encode()


def test_smoke_lines_hide_a_url_password_and_a_key_the_server_quotes(tandem_here, tmp_path):
    answers = {"POST /tokenize": quoting_the_key}
    with openai_stub(answers) as stub:
        url = stub.url.replace("http://", f"http://user:{PASSWORD}@")
        result = tandem_here(
            "eval", "smoke", "--url", url, "--api-key", KEY, "--check", "template",
            "--out", str(tmp_path / "s"),
        )  # fmt: skip
    assert result.code == 1 and "template" in result.out and "answered 400" in result.out
    shown = result.out + result.err
    assert KEY not in shown and PASSWORD not in shown and "REDACTED" in shown
    for written in (tmp_path / "s").iterdir():
        assert KEY not in written.read_text() and PASSWORD not in written.read_text()


def restored_revisions(home: Path, name: str) -> None:
    """Two revisions as a backup brought them back: a secret in the recipe's env, written
    without tandem's redaction, and a 3 MB field."""
    folder = home / "deployments" / name / "revisions"
    folder.mkdir(parents=True)
    for number, size in ((1, 1), (2, 3_000_000)):
        recipe = {
            "name": name,
            "env": {"DB_PASSWORD": "plain-db-secret-1", "HF_TOKEN": "hf_" + "a" * 30},
            "description": "d" * size,
        }
        revision = revisions.Revision(
            number=number,
            recipe=recipe,
            cluster={},
            reason=f"smoke failed at http://user:{PASSWORD}@host/",
        )
        (folder / f"{number}.json").write_text(revision.model_dump_json())


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_history_hides_what_a_revision_holds_and_cuts_a_long_field(tandem_here, tmp_path, as_json):
    restored_revisions(tmp_path / "home", "demo")
    result = tandem_here(
        "history", "demo", *(["--json"] if as_json else []), TANDEM_HOME=str(tmp_path / "home")
    )
    assert result.code == 0, result.err
    shown = result.out + result.err
    for secret in ("plain-db-secret-1", "hf_" + "a" * 30, PASSWORD):
        assert secret not in shown
    if as_json:
        assert json.loads(result.out)[1]["recipe"]["env"]["DB_PASSWORD"] == "REDACTED"
    else:
        assert "(3000002 characters)" in result.out and len(result.out) < 2000
