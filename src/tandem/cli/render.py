"""``tandem render``: print what every rank runs."""

from __future__ import annotations

import click

from tandem.cli.options import cluster_option, machine_deployment, recipe_argument
from tandem.rankplan import plan_ranks
from tandem.render import commands


@click.command("render")
@recipe_argument
@cluster_option
@click.option("--format", "fmt", type=click.Choice(["shell", "json"]), default="shell",
              show_default=True, help="shell: commands to paste on each node; json: for scripts.")
@click.option("--target", type=click.Choice(["process"]), default="process", show_default=True,
              help="What runs each rank: a plain process on the node.")
def render_command(recipe: str, cluster_path: str | None, fmt: str, target: str) -> None:
    """Print each rank's exact command and environment, workers first.

    RECIPE is a built-in recipe name or a path to a recipe YAML.

    \b
    Examples:
      tandem render tiny-local
      tandem render deepseek-v4-flash-dspark --cluster examples/dgx-spark-eks.yaml
      tandem render deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml --format json
    """
    plan = plan_ranks(machine_deployment(recipe, cluster_path))
    click.echo(commands.to_json(plan) if fmt == "json" else commands.to_shell(plan), nl=False)
