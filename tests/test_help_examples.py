"""Every `Examples:` line of every `--help` works as written (newcomer review, defect 5), and
every `tandem ...` command a `fix:` hint names for the built-in recipes is a real one.

Each example runs in a folder of its own (``examples/`` there is the repository's; a file the
example names that is the user's own, such as ``new.yaml`` or ``runs/b1``, is made empty), with
a Hugging Face home that holds the models' ``config.json`` files only (planned from them):

- commands that only read or print (``recipes``, ``recipe``, ``render``, ``plan``, ``status``,
  ``init --dry-run``) run, and must exit 0;
- ``up`` runs with ``--dry-run`` added: everything up to the first start;
- every other command (one that starts, stops, builds, downloads or needs a running
  deployment) is parsed by its own command line, and what it names must exist: a RECIPE a
  built-in or a file, a ``--cluster`` an inventory that loads, a deployment the name a built-in
  recipe deploys under, a ``--model`` the name a built-in recipe serves.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import click
import pytest

from tandem.check.rules.software import fetch_command
from tandem.cli import cli
from tandem.cli.helpdoc import _walk
from tandem.errors import TandemError
from tandem.plan.planner import plan_for
from tandem.spec.loading import builtin_recipe_names, load_cluster, load_deployment, load_recipe

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "fixtures"
RUN = {("recipes",), ("recipe", "show"), ("recipe", "schema"), ("render",), ("plan",)}
RUN |= {("status",)}
DEPLOYMENT_PARAMS = {"name", "deployment"}
"""Parameters that name a deployment (``status NAME``, ``bench DEPLOYMENT``)."""


def examples() -> list[tuple[str, str]]:
    """(the help it is in, the example's command line) of every example."""
    found = []
    for ctx in _walk(cli, "tandem", None):
        text = ctx.command.get_help(ctx)
        if "Examples:" not in text:
            continue
        block = text.split("Examples:", 1)[1].replace("\\\n", " ")
        for line in block.splitlines()[1:]:
            if not line.strip():
                break
            for words in _commands_of(line):
                found.append((ctx.command_path, shlex.join(words)))
    return found


SHELL = {">", ">>", "|", "&", "&&", ";"}


def _commands_of(line: str) -> list[list[str]]:
    """The `tandem ...` commands of one shell line, each up to its redirection or operator."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for token in [*lexer, "&&"]:
        if token in SHELL:
            if "tandem" in words:
                commands.append(words[words.index("tandem") :])
            words = [] if token in ("&&", ";", "&") else ["-"]  # past > or |: not ours
            continue
        if words != ["-"]:
            words.append(token)
    return commands


def test_every_help_has_examples():
    for ctx in _walk(cli, "tandem", None):
        assert "Examples:" in ctx.command.get_help(ctx), f"{ctx.command_path}: add examples"


SERVED = {load_recipe(n).model.name_for_clients for n in builtin_recipe_names()}


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A folder with the repository's examples/ and a cache of the models' configs only."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    hub = tmp_path / "hf" / "hub"
    for repo, config in (
        ("tandem-org/smollm2-135m-instruct", "configs/smollm2-135m-instruct.json"),
        ("tandem-org/gemma3-270m", "configs/gemma3-270m.json"),
        ("tandem-org/tiny-deepseek-v3", "plan/tiny-configs/deepseek-v3.json"),
    ):
        snapshot = hub / f"models--{repo.replace('/', '--')}" / "snapshots" / "0"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text((CONFIGS / config).read_text())
        (snapshot.parent.parent / "refs").mkdir()
        (snapshot.parent.parent / "refs" / "main").write_text("0")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TANDEM_CLUSTER", raising=False)
    return tmp_path


def _command(words: list[str]) -> tuple[click.Command, list[str], tuple[str, ...]]:
    """The (sub)command an example runs, its own arguments and its path."""
    command: click.Command = cli
    path: list[str] = []
    rest = words[1:]
    ctx = click.Context(cli)
    while isinstance(command, click.Group) and rest and rest[0] in command.list_commands(ctx):
        path.append(rest[0])
        command = command.get_command(ctx, rest[0])  # type: ignore[assignment]
        rest = rest[1:]
    if isinstance(command, click.Group):  # bench/watch without a subcommand: their `run`
        path.append("run")
        command = command.get_command(ctx, "run")  # type: ignore[assignment]
    return command, rest, tuple(path)


def _users_files(words: list[str]) -> set[str]:
    """Make every file the example names that is the user's own (not in the repository) as an
    empty one, and return their names."""
    made = set()
    for previous, word in itertools.pairwise(words):
        if word.startswith(("-", "http")) or previous in ("--model", "--hosts", "--url"):
            continue
        if "/" not in word and not re.search(r"\.(ya?ml|json|jsonl|csv|log|md)$", word):
            continue
        path = Path(word).expanduser()
        if path.exists():
            continue
        if path.suffix:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.mkdir(parents=True, exist_ok=True)
        made.add(word)
    return made


@pytest.mark.parametrize(("where", "line"), examples())
def test_the_example_works_as_written(sandbox, tandem_here, where, line):
    words = shlex.split(line)
    command, args, path = _command(words)
    made = _users_files(words)
    if path == ("up",) and "--dry-run" not in args:
        args = [*args, "--dry-run"]
        path = ("up dry",)
    runs = path in RUN or path == ("up dry",) or (path == ("init",) and "--dry-run" in args)
    if path == ("status",) and args and not args[0].startswith("-"):
        runs = False  # one deployment's status: none runs here
    if runs and not made:
        result = tandem_here(*words[1:], *(["--dry-run"] if path == ("up dry",) else []))
        assert result.code == 0, f"{line}\n{result.out}\n{result.err}"
        return
    ctx = command.make_context(" ".join(path), list(args))  # raises on what it refuses
    _names_exist(ctx.params, path, made)


def _names_exist(params: dict, path: tuple[str, ...], users: set[str]) -> None:
    """What the example names exists: the recipe, the cluster, the deployment, the model (a
    file of the user's own excepted)."""
    if params.get("recipe") and params["recipe"] not in users:
        load_recipe(params["recipe"])
    if params.get("cluster_path") and params["cluster_path"] not in users:
        load_cluster(params["cluster_path"])
    if path[0] in ("init", "model", "recipe"):
        return
    for key in DEPLOYMENT_PARAMS & params.keys():
        name = params[key]
        if name and not isinstance(name, tuple):
            assert name in builtin_recipe_names(), f"no built-in recipe deploys as {name!r}"
    words = params.get("words")  # chat: [NAME] MESSAGE
    if words and len(words) == 2:
        assert words[0] in builtin_recipe_names()
    if params.get("model"):
        assert params["model"] in SERVED, f"no built-in recipe serves {params['model']!r}"


def test_the_examples_are_found():
    """The collector sees the examples of every command (a wrong split would pass vacuously)."""
    found = examples()
    assert len(found) > 100
    assert (
        "tandem bench run",
        "tandem bench run tiny-local --concurrency 1,2,4 --out runs/b1",
    ) in found


def _fix_commands(text: str) -> list[str]:
    return [
        c for c in re.findall(r"`(tandem [^`]+)`", text) if "NAME" not in c and "RECIPE" not in c
    ]


def test_every_tandem_command_a_fix_names_for_the_built_in_recipes_parses(
    sandbox, monkeypatch, tandem_here
):
    """The fixes tandem prints when a built-in recipe's model is missing, when it does not plan
    on a cluster, and when a deployment is not found: each `tandem ...` they quote is a
    command line the CLI takes."""
    monkeypatch.setenv("HF_HOME", str(sandbox / "empty"))
    hints: list[str] = []
    clusters = [None, *sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))]
    for name in builtin_recipe_names():
        for cluster in clusters:
            try:
                deployment = load_deployment(name, cluster)
                hints.append(fetch_command(deployment))
                plan_for(deployment, hardware="cpu")
            except TandemError as exc:
                hints += [str(exc.hint or "")] + [str(p.hint or "") for p in exc.problems]
    for args in (["status", "nosuch"], ["logs"], ["history", "nosuch"], ["render", "nosuch"]):
        hints.append(tandem_here(*args).err)
    commands = {c for hint in hints for c in _fix_commands(hint)}
    assert any(c.startswith("tandem model") for c in commands)
    for line in sorted(commands):
        words = shlex.split(line)
        command, args, path = _command(words)
        command.make_context(" ".join(path), list(args))
