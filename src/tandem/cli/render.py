"""``tandem render``: print what every rank runs."""

from __future__ import annotations

import click

from tandem.cli.options import cluster_option, machine_deployment, recipe_argument
from tandem.rankplan import plan_ranks
from tandem.render import TARGETS, check_format, renderer_for


@click.command("render")
@recipe_argument
@cluster_option
@click.option("--format", "fmt", type=click.Choice(["shell", "json", "yaml"]), default=None,
              help="shell: commands to paste on each node; json: for scripts; yaml: manifests "
              "(k8s only). Default: the target's own (shell, or yaml for k8s).")
@click.option("--target", type=click.Choice(sorted(TARGETS)), default="process",
              show_default=True, help="What runs each rank: a plain process on the node, a "
              "container, or a Kubernetes LeaderWorkerSet.")
def render_command(recipe: str, cluster_path: str | None, fmt: str, target: str) -> None:
    """Print each rank's exact command and environment, workers first.

    RECIPE is a built-in recipe name or a path to a recipe YAML.

    \b
    Examples:
      tandem render tiny-local
      tandem render deepseek-v4-flash-dspark --cluster examples/dgx-spark-eks.yaml
      tandem render deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml --format json
    """
    fmt = check_format(target, fmt)  # before any file is read: a wrong flag is the first fault
    deployment = machine_deployment(recipe, cluster_path)
    plan = plan_ranks(deployment)
    click.echo(renderer_for(target)(plan, deployment, fmt), nl=False)
