"""The README's first screen says how to install for real use and names the two commands, and
its command table lists every command the CLI has (newcomer review: 10 rows for 18)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tandem.cli import COMMANDS
from tandem.version import DISTRIBUTION

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_command_table_is_the_cli():
    table = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `tandem ([a-z-]+)` \|", table, re.M)
    assert rows == list(COMMANDS), "the README's command table differs from `tandem --help`"


def test_the_first_screen_says_how_to_install_and_the_two_commands():
    first = README[: README.index("## Commands")]
    assert "pip install ." in first and DISTRIBUTION in first
    for extra in ("k8s", "router", "model"):
        assert f"'.[{extra}]'" in first
    assert "make demo" in first and "make test" in first
    assert "On each node" in first


def test_the_distribution_ships_its_data_and_the_extras_the_readme_names():
    """The wheel's name is ours, and it carries the recipes, the examples and the references
    (src/tandem/examples and src/tandem/docs link to the repository's own folders)."""
    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["name"] == DISTRIBUTION
    assert {"k8s", "router", "model"} <= set(project["project"]["optional-dependencies"])
    data = project["tool"]["setuptools"]["package-data"]["tandem"]
    for pattern in data:
        assert list((root / "src" / "tandem").glob(pattern)), f"{pattern} matches no file"
    for shipped in ("examples/dgx-spark-pair.yaml", "docs/recipes.md", "docs/cli.md"):
        assert any(Path(shipped).match(p) for p in data), shipped
        assert (root / "src" / "tandem" / shipped).is_file()
