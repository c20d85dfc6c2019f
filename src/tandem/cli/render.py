"""``tandem render``: print what every rank runs."""

from __future__ import annotations

from pathlib import Path

import click

from tandem import files, ownership, screen
from tandem.cli.options import (
    cluster_option,
    force_option,
    machine_deployment,
    out_option,
    recipe_argument,
)
from tandem.rankplan import template_plan
from tandem.render import TARGETS, check_format, files_renderer_for, renderer_for

WHOLE_DEPLOYMENT = {"k8s", "prometheus", "grafana"}
"""The targets that render a deployment with replicas whole (every group)."""
RUN = ownership.RunKind("render", "rendered files", resume_flag=None)
"""``render --out``: one deployment's files for one target, written again by the same render."""


@click.command("render")
@recipe_argument
@cluster_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["shell", "json", "yaml"]),
    default=None,
    help="shell: commands to paste on each node; json: for scripts; yaml: manifests "
    "(k8s only). Default: the target's own (shell, or yaml for k8s).",
)
@click.option(
    "--target",
    type=click.Choice(sorted(TARGETS)),
    default="process",
    show_default=True,
    help="What runs each rank: a plain process on the node, a "
    "container, a Kubernetes LeaderWorkerSet; prometheus: scrape config and alert "
    "rules for the running deployment; grafana: its data source, dashboards and "
    "recording rules.",
)
@out_option(
    "Write the target's files into this folder instead of printing them "
    "(prometheus: prometheus.yml, tandem-rules.yml, README.md; grafana: provisioning/, "
    "dashboards/, tandem-recording-rules.yml, README.md)."
)
@force_option
def render_command(
    recipe: str, cluster_path: str | None, fmt: str, target: str, out_dir: str | None, force: bool
) -> None:
    """Print each rank's exact command and environment, workers first.

    RECIPE is a built-in recipe name or a path to a recipe YAML.

    \b
    Examples:
      tandem render tiny-local
      tandem render deepseek-v4-flash-dspark --cluster examples/dgx-spark-eks.yaml
      tandem render deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml --format json
      tandem render tiny-local --target prometheus --out prom/
      tandem render tiny-local --target grafana --out grafana/
    """
    fmt = check_format(target, fmt)  # before any file is read: a wrong flag is the first fault
    deployment = machine_deployment(recipe, cluster_path)
    on_kubernetes = deployment.cluster.transport.value == "k8s"
    if deployment.recipe.replicas > 1 and (
        target not in WHOLE_DEPLOYMENT or (on_kubernetes and target != "k8s")
    ):
        raise click.UsageError(
            f"--target {target} renders one group; with replicas `tandem up --dry-run` shows "
            "every group's commands, --target k8s renders the LeaderWorkerSet's replicas, and "
            "prometheus and grafana every group off Kubernetes"
        )
    plan = template_plan(deployment)  # with replicas: one group, the template
    if out_dir:
        written = files_renderer_for(target)(plan, deployment)  # refused before a folder is made
        out = ownership.claim_output(
            Path(out_dir), RUN, {"recipe": deployment.name, "target": target}, force=force
        ).make()
        for name, text in written.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)  # grafana's provisioning/
            files.write_text(out / name, text)
            screen.echo(f"wrote {out / name}")
        return
    screen.echo(renderer_for(target)(plan, deployment, fmt), nl=False)
