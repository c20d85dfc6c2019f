"""One set of conventions across the commands (newcomer review, defects 7, 12 and 13): a way
to list deployments, `down` that may run twice, names as positional arguments, JSON that is
valid when there is nothing, help that is grouped and never cut mid-sentence."""

from __future__ import annotations

import json

import click
import pytest

from tandem.cli import COMMANDS, SECTIONS, cli
from tandem.cli.helpdoc import _walk
from tandem.operations import lifecycle


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_status_without_a_deployment_lists_none_and_exits_0(empty_home, tandem_here):
    result = tandem_here("status")
    assert result.code == 0, result.err
    assert "no deployment" in result.out and "tandem up RECIPE" in result.out
    for args in (("status", "--json"), ("status", "--all", "--json")):
        result = tandem_here(*args)
        assert result.code == 0 and json.loads(result.out) == []


def test_status_names_what_a_broken_deployment_lacks_and_lists_the_others(empty_home, tandem_here):
    for name in ("alpha", "beta"):
        folder = empty_home / "deployments" / name
        folder.mkdir(parents=True)
        (folder / "state.json").write_text("{not json")
    result = tandem_here("status", "--json")
    assert result.code == 0, result.err
    lines = json.loads(result.out)
    assert [line["name"] for line in lines] == ["alpha", "beta"]
    assert all(line["verdict"] is None and line["error"] for line in lines)


def test_down_with_nothing_to_stop_exits_0_so_a_script_may_call_it_twice(
    empty_home, tandem_here, monkeypatch
):
    # As root, `down` first removes the networks killed commands left on this machine, which
    # are another test's business: this one is about what the CLI says after it.
    monkeypatch.setattr(lifecycle, "sweep_leftovers", lambda on_event: 0)
    for args in (("down",), ("down", "nosuch")):
        result = tandem_here(*args)
        assert result.code == 0, result.err
        assert "nothing to stop" in result.out


def test_chat_takes_the_deployment_as_its_first_word(empty_home, tandem_here):
    """`tandem chat NAME MESSAGE` as `status NAME`, `logs NAME`; one word is the message."""
    result = tandem_here("chat", "nosuch", "Hello")
    assert result.code == 2 and "no deployment named 'nosuch'" in result.err
    result = tandem_here("chat", "a", "b", "c")
    assert result.code == 2 and "quote the message" in result.err


def test_a_mistyped_command_names_the_nearest_one(tandem_here):
    result = tandem_here("stauts")
    assert result.code == 2 and "Did you mean 'status'?" in result.err


def test_every_command_is_in_one_section_of_the_help(tandem_here):
    result = tandem_here("--help")
    assert result.code == 0
    for title in SECTIONS:
        assert f"{title}:" in result.out
    for name in COMMANDS:
        assert f"\n  {name} " in result.out
    assert "Exit status" in result.out and "_TANDEM_COMPLETE" in result.out


def _contexts():
    return list(_walk(cli, "tandem", None))


def test_no_summary_of_a_subcommand_is_cut_short():
    """Click cuts a group's list at 45 characters with '...'; each summary shows whole."""
    for ctx in _contexts():
        if not isinstance(ctx.command, click.Group):
            continue
        text = " ".join(ctx.command.get_help(ctx).split())
        for name in ctx.command.list_commands(ctx):
            sub = ctx.command.get_command(ctx, name)
            summary = COMMANDS[name][1] if ctx.parent is None else sub.get_short_help_str(1000)
            assert not summary.endswith("..."), f"{ctx.command_path} {name}"
            assert f"{name} {summary}" in text, f"{ctx.command_path} {name}: {summary}"
            assert len(summary) <= 90, f"{ctx.command_path} {name}: shorten its first sentence"


def test_long_option_lists_are_grouped():
    """A command with more than 12 options shows them under headings, not as one wall."""
    for ctx in _contexts():
        options = [p for p in ctx.command.params if isinstance(p, click.Option)]
        if len(options) > 12:
            text = ctx.command.get_help(ctx)
            assert "\nOptions:\n" not in text, f"{ctx.command_path}: group its options"


def test_tandem_alone_prints_its_help_and_exits_0(tandem_here):
    result = tandem_here()
    assert result.code == 0 and "Start here:" in result.out
