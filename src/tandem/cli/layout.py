"""How a command's help is laid out: long option lists under headings, and a group's list of
subcommands with each summary whole.

Click writes every option of a command under one ``Options:`` heading (``bench run`` has 42)
and cuts a group's summaries at about 45 characters with ``...``. ``SectionedCommand`` writes
the options under the headings a command names (those it does not name last, under
``Other options``); ``WholeSummaryGroup`` writes each subcommand's first sentence whole, wrapped
by the formatter instead of cut; ``RunByDefault`` also sends what is not one of its
subcommands to ``run``.

Usage:
    @click.command("run", cls=SectionedCommand, sections={"Load": ["concurrency", "rates_rps"]})
    @click.group("eval", cls=WholeSummaryGroup, context_settings=HELP_OPTIONS)
"""

from __future__ import annotations

from typing import Any

import click

LONG_SUMMARY = 1000
"""Characters of a summary Click may keep: the whole first sentence."""
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
"""The context settings of ``tandem`` and its groups: ``-h`` is ``--help``."""


class SectionedCommand(click.Command):
    """A command whose options are shown under headings: ``sections`` maps a heading to the
    names of its parameters (the function's argument names), in the order to show them."""

    def __init__(self, *args: Any, sections: dict[str, list[str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections = sections

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {
            param.name: record
            for param in self.get_params(ctx)
            if isinstance(param, click.Option) and (record := param.get_help_record(ctx))
        }
        named = {name for names in self.sections.values() for name in names}
        unknown = named - set(records)
        if unknown:  # a heading that names no option: a renamed parameter, caught by the tests
            raise click.ClickException(f"help sections name unknown options: {sorted(unknown)}")
        groups = [*self.sections.items(), ("Other options", [n for n in records if n not in named])]
        for title, names in groups:
            if names:
                with formatter.section(title):
                    formatter.write_dl([records[name] for name in names])


class WholeSummaryGroup(click.Group):
    """A group whose list of subcommands shows each one's first sentence, never cut."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(LONG_SUMMARY)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class RunByDefault(WholeSummaryGroup):
    """A group whose ``run`` subcommand is also its short form: ``tandem bench [DEPLOYMENT]
    [--options]`` is ``tandem bench run ...``, and so for ``tandem watch``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["run", *args]
        return super().parse_args(ctx, args)
