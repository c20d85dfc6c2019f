"""``tandem.files``, the one writing path: every file and line is redacted, a replaced file is
replaced whole, a deployment's files are private, and JSON stays JSON."""

from __future__ import annotations

import ast
import json
import re
import stat
from pathlib import Path

import pytest
from pydantic import BaseModel

from tandem import files
from tandem.redact import REDACTED, Redactor

CALLER_KEY = "caller-api-key-0123456789"
ARG_KEY = "key-given-as-an-argument-42"


class Record(BaseModel):
    key: str  # a hash, not a secret: tandem's own field names are not judged by name
    text: str
    argv: list[str]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def caller(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", CALLER_KEY)


def test_a_text_file_is_redacted_and_replaced_whole(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")
    files.write_text(path, f"key {CALLER_KEY}, url http://u:pw-123456@h, env HF_TOKEN=abc x\n")
    assert path.read_text() == (
        f"key {REDACTED}, url http://u:{REDACTED}@h, env HF_TOKEN={REDACTED} x\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no temporary file left


def test_json_keeps_its_shape_and_tandems_own_keys(tmp_path):
    record = Record(
        key="3f2a" * 16,
        text=f'said "--token={ARG_KEY}" then \\ left',
        argv=["vllm", "--api-key", CALLER_KEY],
    )
    path = files.write_json(tmp_path / "r.json", record, redactor=Redactor.for_caller([ARG_KEY]))
    text = path.read_text()
    assert ARG_KEY not in text and CALLER_KEY not in text and text.endswith("}\n")
    data = json.loads(text)
    assert data["key"] == "3f2a" * 16
    assert data["text"] == f'said "--token={REDACTED}" then \\ left'
    assert data["argv"] == ["vllm", "--api-key", REDACTED]


def test_lines_are_appended_redacted_and_flushed(tmp_path):
    path = tmp_path / "samples.jsonl"
    with files.LineLog(path, new=True) as log:
        log.write_json({"text": f"Bearer {CALLER_KEY}"})
        log.write(f"2026-12-01T08:00:00Z  leader answered 401 to {CALLER_KEY}")
        assert path.read_text().count("\n") == 2  # on disk before the log is closed
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"text": f"Bearer {REDACTED}"}
    assert lines[1].endswith(f"401 to {REDACTED}")
    with pytest.raises(FileExistsError):
        files.LineLog(path, new=True)
    files.write_jsonl(path, [{"n": 1}, {"n": CALLER_KEY}])
    assert path.read_text() == f'{{"n":1}}\n{{"n":"{REDACTED}"}}\n'


def test_private_files_and_folders(tmp_path):
    folder = files.private_dir(tmp_path / "a" / "b")
    files.write_json(folder / "state.json", {"x": 1}, private=True)
    files.append_line(folder / "events.log", "supervising", private=True)
    (folder / "old").write_text("y")
    (folder / "old").chmod(0o644)
    with files.open_private(folder / "old", "a") as handle:
        handle.write("z")
    with files.open_private(folder / "bundle.tar.gz", "xb") as handle:
        handle.write(b"x")
    assert mode(folder) == 0o700
    for name in ("state.json", "events.log", "old", "bundle.tar.gz"):
        assert mode(folder / name) == 0o600, name
    assert (folder / "old").read_text() == "yz"
    with pytest.raises(FileExistsError):
        files.open_private(folder / "bundle.tar.gz", "xb")


WRITES_ELSEWHERE = {
    "tandem/files.py": "the one writing path itself",
    "tandem/agent.py": "the stdlib-only node agent: its facts and the liveness probe's state "
    "file, on a node",
    "tandem/models/tiny.py": "a model's own files (config) in the HF cache, no user text",
    "tandem/models/shapes.py": "a model's own files (config) in the HF cache, no user text",
    "tandem/models/real.py": "a model's own files (refs/main) in the HF cache, no user text",
    "tandem/models/store.py": "a built model's refs/main in the HF cache, no user text",
    "tandem/cli/helpdoc.py": "docs/cli.md and docs/recipes.md, generated from CLI and models",
    "tandem/backends/systemd.py": "the service's env file exists to hold the key; its unit",
    "tandem/check/fabric.py": "a child process's output, read back through a redactor",
}
"""Modules that write files without ``tandem.files``, each with why."""


def _writes(tree: ast.AST) -> list[int]:
    """Lines that write a file: ``.write_text``/``.write_bytes``, ``open``/``.open``/
    ``os.fdopen`` with a mode that writes, ``json.dump``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
        if owner in ("files", "tarfile"):  # the path itself; an archive into its handle
            continue
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if isinstance(func, ast.Name) and name != "open":  # write_text from tandem.files
            continue
        constants = [a.value for a in node.args if isinstance(a, ast.Constant)]
        constants += [k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)]
        writes_mode = any(
            isinstance(c, str) and re.fullmatch(r"[rwaxbt+]{1,3}", c) and set(c) & set("wax+")
            for c in constants
        )
        if name in ("write_text", "write_bytes", "dump") or (
            name in ("open", "fdopen") and writes_mode
        ):
            found.append(node.lineno)
    return found


def test_every_writer_goes_through_the_one_path():
    """A new writer cannot forget redaction: a file write outside ``tandem.files`` fails here
    unless its module is listed, with why, in ``WRITES_ELSEWHERE``."""
    src = Path(files.__file__).parents[1]
    found = {}
    for path in sorted((src / "tandem").rglob("*.py")):
        name = path.relative_to(src).as_posix()
        if name in WRITES_ELSEWHERE:
            continue
        lines = _writes(ast.parse(path.read_text()))
        if lines:
            found[name] = lines
    assert found == {}, "write through tandem.files (write_text, write_json, LineLog)"
