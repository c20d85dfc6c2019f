"""The recipe and cluster reference is generated from the models, complete and current; the
built-in recipes can be listed, shown and checked against the JSON Schema (newcomer review,
defects 2 and 4)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from tandem.cli import cli
from tandem.rankplan import plan_ranks
from tandem.spec.deployment import Deployment
from tandem.spec.loading import builtin_recipe_names, example_files, load_cluster, load_recipe
from tandem.spec.reference import (
    ROOTS,
    all_fields,
    example_of,
    reference_markdown,
    sections,
    shipped_values,
)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "recipes.md"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_the_checked_in_reference_is_current():
    assert DOCS.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/recipes.md is stale: run `.venv/bin/python -m tandem.cli.helpdoc` and commit it"
    )


@pytest.mark.parametrize("kind", list(ROOTS))
def test_every_field_has_a_description_and_an_example(kind):
    shipped = shipped_values()[kind]
    lacking = [
        f.path
        for f in all_fields(ROOTS[kind])
        if len(f.description) < 10 or example_of(f, shipped) is None
    ]
    assert lacking == [], f"give these fields a description and examples=[...]: {lacking}"
    for section in sections(ROOTS[kind]):
        assert section.model.__doc__, f"{section.path}: the model needs a docstring"


def test_every_field_is_in_the_reference():
    text = DOCS.read_text(encoding="utf-8")
    for root in ROOTS.values():
        for field in all_fields(root):
            assert f"**`{field.path.rsplit('.', 1)[-1]}`**" in text, field.path


def _seed_with_everything_set() -> Deployment:
    """The seed 000 recipe on its Spark pair, with the fields it leaves at a default that is
    not rendered set, so that every flag or variable a field claims to become shows."""
    recipe = load_recipe("deepseek-v4-flash-dspark")
    recipe = recipe.model_copy(update={"model": recipe.model.model_copy(update={"revision": "v1"})})
    return Deployment(recipe=recipe, cluster=load_cluster(ROOT / "examples/dgx-spark-pair.yaml"))


def test_what_a_field_says_it_becomes_is_on_the_rank():
    """`becomes` is a claim of the reference; the rank plan is the truth."""
    plan = plan_ranks(_seed_with_everything_set())
    argv = {a.split("=", 1)[0] for r in plan.ranks for a in r.argv}
    env = {k for r in plan.ranks for k in r.env}
    checked = 0
    for root in ROOTS.values():
        for field in all_fields(root):
            for name in field.becomes:
                if name.startswith("--") and field.path.startswith("engine.serve."):
                    continue  # each serve field's flag: tests/test_render.py renders them all
                if name.startswith("--"):
                    assert name in argv, f"{field.path} -> {name}"
                    checked += 1
                elif name.isupper():
                    assert name in env, f"{field.path} -> {name}"
                    checked += 1
    assert checked >= 15


def test_built_in_recipes_deploy_under_their_own_name():
    """`tandem up deepseek-v4-flash-dspark` is found again as deepseek-v4-flash-dspark."""
    for name in builtin_recipe_names():
        assert load_recipe(name).name == name


def test_recipes_lists_each_built_in_recipe_with_its_description():
    result = invoke("recipes")
    assert result.exit_code == 0, result.output
    for name in builtin_recipe_names():
        line = next(line for line in result.output.splitlines() if line.startswith(name + " "))
        assert load_recipe(name).description in line
    assert "examples/dgx-spark-pair.yaml" in result.output


def test_recipes_json_lists_recipes_and_examples():
    listing = json.loads(invoke("recipes", "--json").output)
    assert [r["name"] for r in listing["recipes"]] == builtin_recipe_names()
    assert listing["examples"] == example_files() and listing["examples"]


def test_recipe_show_prints_the_file_that_loads_as_the_built_in(tmp_path):
    result = invoke("recipe", "show", "smollm2-local")
    assert result.exit_code == 0
    copy = tmp_path / "mine.yaml"
    copy.write_text(result.output)
    assert load_recipe(copy) == load_recipe("smollm2-local")
    assert result.output.startswith("#")  # comments kept: they say why


def test_recipe_show_of_an_unknown_name_lists_the_known_ones():
    result = CliRunner().invoke(cli, ["recipe", "show", "nosuch"], standalone_mode=False)
    assert "smollm2-local" in str(result.exception.hint)


@pytest.mark.parametrize(("kind", "files"), [("recipe", "recipes"), ("cluster", "examples")])
def test_the_schema_accepts_every_shipped_file(kind, files):
    args = ["recipe", "schema"] + (["--cluster"] if kind == "cluster" else [])
    schema = json.loads(invoke(*args).output)
    if kind == "recipe":
        texts = [(ROOT / "src/tandem/recipes" / f"{n}.yaml") for n in builtin_recipe_names()]
        texts += [ROOT / p for p in example_files() if "/recipes/" in p]
    else:
        texts = [ROOT / p for p in example_files() if "/recipes/" not in p]
    for path in texts:
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x", "nodez": []}, schema)


def test_a_shipped_example_path_works_from_any_folder(tmp_path, monkeypatch):
    """Hints and help name `examples/...`; a package install has them too."""
    monkeypatch.chdir(tmp_path)
    assert load_cluster("examples/dgx-spark-pair.yaml").name
    result = invoke("render", "deepseek-v4-flash", "--cluster", "examples/dgx-spark-pair.yaml")
    assert result.exit_code == 0, result.output
