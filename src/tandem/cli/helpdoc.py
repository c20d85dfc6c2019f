"""The generated references: ``docs/cli.md`` (every command's ``--help``) and
``docs/recipes.md`` (every recipe and cluster field, ``tandem.spec.reference``), so neither can
drift from the code.

``docs/cli.md`` is exactly what ``tandem ... --help`` prints at a fixed width of 100 columns,
one section per command and subcommand in ``tandem --help`` order. Tests compare the checked-in
files with fresh renderings and fail when they differ (llm's cog-generated ``docs/help.md``).

Usage:
    python -m tandem.cli.helpdoc            # rewrite docs/cli.md and docs/recipes.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tandem import screen
from tandem.spec.reference import reference_markdown

WIDTH = 100
HEADER = """# tandem command reference

Generated from each command's `--help` by `python -m tandem.cli.helpdoc`; do not edit by hand.
"""


def cli_reference() -> str:
    """The Markdown reference of every command, in help order."""
    from tandem.cli import cli

    sections = [HEADER]
    for ctx in _walk(cli, "tandem", None):
        sections.append(
            f"## `{ctx.command_path}`\n\n```text\n{ctx.command.get_help(ctx).rstrip()}\n```\n"
        )
    return "\n".join(sections)


def _walk(command: click.Command, name: str, parent: click.Context | None):
    """Contexts of a command and all its subcommands, each a child of its group's context (so
    settings such as ``-h`` inherit as they do on a real command line)."""
    settings = {"terminal_width": WIDTH, "max_content_width": WIDTH, **command.context_settings}
    ctx = click.Context(command, parent=parent, info_name=name, **settings)
    yield ctx
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, sub_name, ctx)


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs")
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("cli.md", cli_reference()), ("recipes.md", reference_markdown())):
        (folder / name).write_text(text, encoding="utf-8")
        screen.echo(f"wrote {folder / name}")


if __name__ == "__main__":
    main()
