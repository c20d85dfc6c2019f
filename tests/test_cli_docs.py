"""docs/cli.md is every command's --help as the code prints it today (STYLE §6: generated help,
checked in CI)."""

from __future__ import annotations

from pathlib import Path

from tandem.cli.helpdoc import cli_reference

DOCS = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def test_the_checked_in_cli_reference_is_current():
    assert DOCS.read_text(encoding="utf-8") == cli_reference(), (
        "docs/cli.md is stale: run `.venv/bin/python -m tandem.cli.helpdoc` and commit it"
    )


def test_the_reference_covers_every_command_and_subcommand():
    text = DOCS.read_text(encoding="utf-8")
    for command in (
        "plan",
        "check",
        "render",
        "up",
        "status",
        "logs",
        "down",
        "bench",
        "bench run",
        "bench compare",
        "eval gpqa",
        "model tiny",
    ):
        assert f"## `tandem {command}`" in text
