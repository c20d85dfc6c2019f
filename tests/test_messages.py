"""Messages that name the right thing and the right fix (issue 46, class 5).

A fix must name options that exist: every ``--flag`` in a hint is one of tandem's options, or
another program's, listed in ``OTHER_PROGRAMS`` with the program (the gate, read with ``ast``).
Several nodes that cannot be reached are all named; a name with control characters is shown
escaped and a long one cut; ``sync`` takes the ``--on`` and ``--bwlimit`` that ``model pull``
takes; a refusal leaves no folder behind.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import click
import pytest

from tandem.backends import sync as sync_module
from tandem.backends.pull import NodeSnapshot, Pull
from tandem.cli import cli
from tandem.errors import SpecError, SSHError
from tandem.operations.preflight import probe_all
from tests.factories import make_cluster, make_deployment, make_recipe
from tests.test_sync_plan import FILES, MANIFEST

SRC = Path(__file__).parents[1] / "src" / "tandem"
OTHER_PROGRAMS = {
    "--digests": "docker images --digests",
    "--force-reinstall": "pip install --force-reinstall",
    "--create-namespace": "helm install --create-namespace",
    "--gpus": "docker run --gpus",
    "--speculative-config": "vllm serve --speculative-config",
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def tandem_options(command: click.Command = cli) -> set[str]:
    """Every option of every tandem command and subcommand."""
    found = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            found |= tandem_options(sub) if sub is not None else set()
    return found


def hint_flags(source: str) -> list[tuple[int, str]]:
    """The ``--flags`` in the text of every ``hint=`` (and a ``Problem``'s third argument)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hints: list[ast.AST] = []
        if isinstance(node, ast.keyword) and node.arg == "hint":
            hints.append(node.value)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Problem":
            hints += node.args[2:3]
        for hint in hints:
            for part in ast.walk(hint):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found += [(part.lineno, f) for f in FLAG.findall(part.value)]
    return found


def test_every_flag_a_fix_names_exists():
    known = tandem_options() | set(OTHER_PROGRAMS)
    unknown = [
        f"{path.relative_to(SRC)}:{line}: {flag}"
        for path in sorted(SRC.rglob("*.py"))
        for line, flag in hint_flags(path.read_text(encoding="utf-8"))
        if flag not in known
    ]
    assert unknown == []


def test_the_gate_finds_a_fix_naming_a_flag_that_does_not_exist():
    source = 'raise SpecError("no objective", hint="give --ttft-ms or --tpot-ms")'
    assert [f for _, f in hint_flags(source)] == ["--ttft-ms", "--tpot-ms"]
    assert not {"--ttft-ms", "--tpot-ms"} & tandem_options()


def test_an_slo_search_without_an_objective_names_its_options_and_leaves_no_folder(
    tandem_here, tmp_path
):
    out = tmp_path / "s"
    result = tandem_here("bench", "--url", "http://127.0.0.1:9", "--search-slo", "--out", str(out))
    assert result.code == 2 and "--slo-ttft-ms or --slo-tpot-ms" in result.err
    assert not out.exists()


# --- several unreachable nodes ------------------------------------------------------------------


class Transport:
    """Nodes ``a`` and ``b`` cannot be reached; ``c`` answers."""

    def run_probe(self, node: Any) -> dict[str, Any]:
        if node.name in ("a", "b"):
            raise SSHError(
                f"cannot reach 10.0.0.{node.name}: No route to host",
                reason=SSHError.UNREACHABLE,
                node=node.name,
                hint=f"check that `ssh {node.name} true` works",
            )
        return {"system": {}}


def test_every_unreachable_node_is_named():
    cluster = make_cluster(nodes=3).model_dump(mode="json")
    for node, name in zip(cluster["nodes"], "abc", strict=True):
        node["name"] = name
    deployment = make_deployment(make_recipe(tp=1, pp=3), cluster)
    with pytest.raises(SSHError) as lost:
        probe_all(deployment, Transport())  # type: ignore[arg-type]
    message = str(lost.value)
    assert "2 of 3 nodes could not be probed" in message
    assert "10.0.0.a" in message and "10.0.0.b" in message
    assert "`ssh a true`" in message and "`ssh b true`" in message


# --- names echoed, values cut ---------------------------------------------------------------------


def test_a_name_with_control_characters_is_shown_escaped(tandem_here):
    result = tandem_here("status", "x\x1b[2J\x1b[31mred\u202e")
    assert result.code == 2 and "\x1b" not in result.err and "\u202e" not in result.err
    assert "x\\x1b[2J\\x1b[31mred\\u202e" in result.err


def test_a_long_name_is_cut_with_its_length(tandem_here):
    result = tandem_here("status", "N" * 100_000)
    assert result.code == 2 and "(100000 characters)" in result.err and len(result.err) < 2000


# --- sync takes pull's --on and --bwlimit --------------------------------------------------------


def test_sync_takes_on_and_bwlimit_as_model_pull_does():
    options = {c: {o for p in cli.get_command(click.Context(cli), c).params for o in p.opts}
               for c in ("sync",)}  # fmt: skip
    pull_options = {
        o
        for p in cli.get_command(click.Context(cli), "model")
        .get_command(click.Context(cli), "pull")  # type: ignore[union-attr]
        .params
        for o in p.opts
    }
    assert {"--on", "--bwlimit"} <= options["sync"] & pull_options


def test_sync_copies_from_the_node_named_and_caps_the_copy(monkeypatch):
    deployment = make_deployment(make_recipe(tp=1, pp=2), make_cluster(nodes=2))
    second = deployment.cluster.nodes[1].name
    used: dict[str, Any] = {}

    class FakePull:
        def __init__(self, deployment, *, bwlimit=None, on_event=None):  # type: ignore[no-untyped-def]
            used["bwlimit"] = bwlimit

        def run(self, *, on=None, download=True, dry_run=False):  # type: ignore[no-untyped-def]
            used["on"] = on
            raise SpecError("stop here")

    monkeypatch.setattr(sync_module, "probe_images", lambda deployment, ssh: {})
    monkeypatch.setattr(sync_module, "Pull", FakePull)
    with pytest.raises(SpecError, match="stop here"):
        sync_module.sync(deployment, on=second, bwlimit="500M")
    assert used == {"bwlimit": "500M", "on": second}
    with pytest.raises(SpecError, match="--on ghost: the cluster has no such node"):
        sync_module.sync(deployment, on="ghost")


def test_a_source_named_with_on_comes_before_the_leader():
    deployment = make_deployment(make_recipe(tp=1, pp=2), make_cluster(nodes=2))
    leader, other = (n.name for n in deployment.cluster.nodes)
    whole = [{"name": n, "blob": b, "size": s} for n, (b, s) in FILES.items()]
    found = {
        name: NodeSnapshot(name, {"exists": True, "commit": MANIFEST.commit, "files": whole})
        for name in (leader, other)
    }
    pull = Pull(deployment)
    assert pull.source_of(found, MANIFEST) == leader
    assert pull.source_of(found, MANIFEST, prefer=other) == other


def test_sync_refuses_a_rate_rsync_cannot_read(tandem_here):
    result = tandem_here("sync", "tiny-local", "--bwlimit", "lots")
    assert result.code == 2 and "is not a rate" in result.err
