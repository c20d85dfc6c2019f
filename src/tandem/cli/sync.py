"""``tandem sync``: the same image and model snapshot on every node, copied where missing."""

from __future__ import annotations

import click

from tandem import screen
from tandem.backends.sync import sync
from tandem.cli.options import (
    bwlimit_option,
    cluster_option,
    machine_deployment,
    recipe_argument,
)
from tandem.errors import ClusterError

console = screen.console(highlight=False)


@click.command("sync")
@recipe_argument
@cluster_option
@click.option(
    "--dry-run", is_flag=True, help="Only probe the nodes and print what would be copied."
)
@click.option(
    "--on",
    "on_node",
    default=None,
    metavar="NODE",
    help="The node to copy from when it holds the whole commit (and the image). Default: the "
    "leader, then any node that does.",
)
@bwlimit_option
def sync_command(
    recipe: str, cluster_path: str | None, dry_run: bool, on_node: str | None, bwlimit: str | None
) -> None:
    """Check that every node holds the recipe's image (same digest) and model snapshot (every
    file with the id the Hub gave it); copy what is missing from a node that has it, then verify.

    The snapshot is copied as `tandem model pull` copies it, node to node from an rsync daemon
    on the source's data_address (which downloads when no node holds it: this command does
    not); images are pulled when pinned by digest, else copied with docker save | load. A node
    without room for what it lacks (its Hugging Face cache's disk; twice the image under its
    docker root, where docker load stages the archive) is named before anything is copied.

    \b
    Examples:
      tandem sync deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml --dry-run
      tandem sync tiny-local --cluster cluster.yaml
      tandem sync deepseek-v4-flash --cluster pair.yaml --on spark-2 --bwlimit 500M
    """
    deployment = machine_deployment(recipe, cluster_path)
    if deployment.cluster.transport.value != "ssh":
        raise ClusterError(
            "tandem sync copies between SSH nodes; this cluster's transport is "
            f"{deployment.cluster.transport.value}",
            field="transport",
            hint="pass an inventory with transport: ssh via --cluster",
        )
    report = sync(
        deployment,
        dry_run=dry_run,
        on=on_node,
        bwlimit=bwlimit,
        on_event=lambda text: console.print(f"  [dim]{text}[/dim]", soft_wrap=True),
    )
    if dry_run:
        for action in report.actions:
            console.print(f"would {action}", soft_wrap=True)
        console.print(
            "nothing to copy" if not report.actions else f"{len(report.actions)} copy/copies needed"
        )
        return
    console.print(
        f"[green]in sync[/green]: {len(deployment.cluster.nodes)} node(s)"
        + (f", {len(report.actions)} repair(s) made and verified" if report.actions else "")
    )
