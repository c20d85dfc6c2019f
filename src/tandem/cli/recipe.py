"""``tandem recipes`` and ``tandem recipe``: the built-in recipes and example inventories, one
to copy, and the JSON Schema of both files (the reference is ``docs/recipes.md``)."""

from __future__ import annotations

import json

import click
from pydantic import BaseModel

from tandem import screen
from tandem.cli.layout import HELP_OPTIONS, WholeSummaryGroup
from tandem.cli.options import json_option
from tandem.errors import RecipeError
from tandem.spec.loading import (
    EXAMPLES,
    builtin_recipe_names,
    builtin_recipe_text,
    example_files,
    load_recipe,
    shipped_example,
)
from tandem.spec.reference import ROOTS


class RecipeLine(BaseModel):
    """One built-in recipe as ``tandem recipes --json`` lists it."""

    name: str
    description: str
    model: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    replicas: int


class Listing(BaseModel):
    """``tandem recipes --json``: the built-in recipes and the example files shipped."""

    recipes: list[RecipeLine]
    examples: list[str]


def listing() -> Listing:
    recipes = [load_recipe(name) for name in builtin_recipe_names()]
    lines = [
        RecipeLine(
            name=recipe.name,
            description=recipe.description,
            model=recipe.model.repo_id,
            tensor_parallel_size=recipe.engine.serve.tensor_parallel_size,
            pipeline_parallel_size=recipe.engine.serve.pipeline_parallel_size,
            replicas=recipe.replicas,
        )
        for recipe in recipes
    ]
    return Listing(recipes=lines, examples=example_files())


@click.command("recipes")
@json_option
def recipes_command(as_json: bool) -> None:
    """List the built-in recipes, one line each, and the example files shipped with tandem.

    A built-in recipe is used by its name (`tandem up smollm2-local`); `tandem recipe show
    NAME` prints it to copy. The example recipes and cluster inventories are used by their
    path as listed (`--cluster examples/dgx-spark-pair.yaml`), from any folder.

    \b
    Examples:
      tandem recipes
      tandem recipes --json
    """
    found = listing()
    if as_json:
        screen.echo(found.model_dump_json(indent=2))
        return
    width = max(len(r.name) for r in found.recipes)
    for r in found.recipes:
        screen.echo(f"{r.name:<{width}}  {r.description}")
    screen.echo(f"\nexample recipes and inventories ({EXAMPLES}/, shipped with tandem):")
    for path in found.examples:
        screen.echo(f"  {path}")


@click.group("recipe", cls=WholeSummaryGroup, context_settings=HELP_OPTIONS)
def recipe_command() -> None:
    """Show a built-in recipe to copy, or the JSON Schema of recipes and clusters.

    Every field is described in docs/recipes.md (generated from the same models).

    \b
    Examples:
      tandem recipe show smollm2-local > mine.yaml
      tandem recipe schema > recipe.schema.json
    """


@recipe_command.command("show")
@click.argument("name", metavar="NAME")
def show_command(name: str) -> None:
    """Print a built-in recipe (or a shipped example file) as it ships, comments included.

    \b
    Examples:
      tandem recipe show smollm2-local
      tandem recipe show smollm2-local > my-recipe.yaml
      tandem recipe show examples/dgx-spark-pair.yaml
    """
    if name in builtin_recipe_names():
        screen.echo(builtin_recipe_text(name), nl=False)
        return
    shipped = shipped_example(name)
    if shipped is None:
        raise RecipeError(
            f"no built-in recipe or shipped example named '{name}'",
            field="NAME",
            hint=f"use one of {', '.join(builtin_recipe_names())}, or an examples/ path "
            "that `tandem recipes` lists",
        )
    screen.echo(shipped.read_text(), nl=False)


@recipe_command.command("schema")
@click.option(
    "--cluster",
    "of_cluster",
    is_flag=True,
    help="The cluster inventory's schema instead of the recipe's.",
)
def schema_command(of_cluster: bool) -> None:
    """Print the JSON Schema of a recipe (or, with --cluster, of a cluster inventory).

    Editors with a YAML language server complete and check a file against it: save it and
    put `# yaml-language-server: $schema=recipe.schema.json` on the file's first line.

    \b
    Examples:
      tandem recipe schema > recipe.schema.json
      tandem recipe schema --cluster > cluster.schema.json
    """
    model = ROOTS["cluster" if of_cluster else "recipe"]
    screen.echo(json.dumps(model.model_json_schema(), indent=2))
