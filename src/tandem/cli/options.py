"""Options and arguments shared by several commands, declared once."""

from __future__ import annotations

import json
import math
import os

import click

from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_deployment


class FloatIn(click.FloatRange):
    """A float within bounds, as ``click.FloatRange``, that also refuses NaN (which compares
    false with every bound and so passes a FloatRange) and infinity unless ``infinite``.

    Usage:
        @click.option("--timeout", type=FloatIn(min=0, min_open=True))
    """

    def __init__(
        self,
        min: float | None = None,
        max: float | None = None,
        *,
        min_open: bool = False,
        max_open: bool = False,
        infinite: bool = False,
    ) -> None:
        super().__init__(min, max, min_open=min_open, max_open=max_open)
        self.infinite = infinite

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if math.isnan(number) or (math.isinf(number) and not self.infinite):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


POSITIVE = FloatIn(min=0, min_open=True)
"""A finite number above 0 (seconds, rates, limits)."""
NOT_NEGATIVE = FloatIn(min=0)
SHARE = FloatIn(min=0, max=1)
"""A share from 0 to 1 inclusive."""
PORT = click.IntRange(1, 65535)

recipe_argument = click.argument("recipe", metavar="RECIPE")
api_key_option = click.option(
    "--api-key",
    envvar="VLLM_API_KEY",
    show_envvar=True,
    help="Bearer token for a server started with an API key; the variable `tandem up` gives "
    "the server.",
)
cluster_option = click.option(
    "--cluster",
    "cluster_path",
    type=click.Path(dir_okay=False),
    envvar="TANDEM_CLUSTER",
    show_envvar=True,
    help="Cluster inventory YAML. Default: this machine, one node per device.",
)


def machine_deployment(recipe: str, cluster_path: str | None) -> Deployment:
    """Load RECIPE on CLUSTER, or on this machine when no cluster is given."""
    return load_deployment(
        recipe,
        cluster_path,
        as_root=os.geteuid() == 0,
        cpu_count=os.cpu_count() or 1,
        gpu_count=_gpu_count(),
    )


def _gpu_count() -> int:
    """NVIDIA devices this machine exposes (0 on a CPU-only machine)."""
    try:
        return sum(
            1
            for name in os.listdir("/dev")
            if name.startswith("nvidia") and name.removeprefix("nvidia").isdigit()
        )
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
