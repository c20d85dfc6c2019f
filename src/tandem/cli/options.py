"""Options and arguments shared by several commands, declared once."""

from __future__ import annotations

import json
import os

import click

from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_deployment

recipe_argument = click.argument("recipe", metavar="RECIPE")
api_key_option = click.option(
    "--api-key", envvar="VLLM_API_KEY", show_envvar=True,
    help="Bearer token for a server started with an API key; the variable `tandem up` gives "
         "the server.")
cluster_option = click.option(
    "--cluster", "cluster_path", type=click.Path(dir_okay=False), envvar="TANDEM_CLUSTER",
    show_envvar=True, help="Cluster inventory YAML. Default: this machine, one node per device.")


def machine_deployment(recipe: str, cluster_path: str | None) -> Deployment:
    """Load RECIPE on CLUSTER, or on this machine when no cluster is given."""
    return load_deployment(recipe, cluster_path, as_root=os.geteuid() == 0,
                           cpu_count=os.cpu_count() or 1, gpu_count=_gpu_count())


def _gpu_count() -> int:
    """NVIDIA devices this machine exposes (0 on a CPU-only machine)."""
    try:
        return sum(1 for name in os.listdir("/dev") if name.startswith("nvidia")
                   and name.removeprefix("nvidia").isdigit())
    except OSError:
        return 0


def json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> dict:
    """Click callback: an option's value parsed as a JSON object (empty when not given)."""
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object, e.g. '{\"top_p\": 0.9}'")
    return parsed
