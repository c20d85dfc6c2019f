"""Options and arguments shared by several commands, declared once."""

from __future__ import annotations

import json
import math
import os
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource
from click.shell_completion import CompletionItem
from pydantic import BaseModel

from tandem.redact import remember_secret
from tandem.spec.deployment import Deployment
from tandem.spec.loading import builtin_recipe_names, example_files, load_deployment
from tandem.spec.recipe import Timeouts


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


DEFAULT = ParameterSource.DEFAULT
POSITIVE = FloatIn(min=0, min_open=True)
"""A finite number above 0 (seconds, rates, limits)."""
SHARE = FloatIn(min=0, max=1)
"""A share from 0 to 1 inclusive."""
PORT = click.IntRange(1, 65535)


def _complete_recipe(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Built-in recipe names and shipped examples that start so, then the shell's files."""
    names = [*builtin_recipe_names(), *example_files()]
    return [CompletionItem(n) for n in names if n.startswith(incomplete)] + [
        CompletionItem(incomplete, type="file")
    ]


def _complete_deployment(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    # Imported when completing only: the state modules double the start of every command
    # that declares this argument (`tandem render` does not need them), as cli/model.py's
    # builders do for torch.
    from tandem.backends.state import list_deployments

    return [CompletionItem(n) for n in list_deployments() if n.startswith(incomplete)]


recipe_argument = click.argument("recipe", metavar="RECIPE", shell_complete=_complete_recipe)
"""A built-in recipe's name, a shipped example (``examples/...``) or a recipe file."""
deployment_argument = click.argument(
    "name", required=False, metavar="[NAME]", shell_complete=_complete_deployment
)
"""A deployment's name; commands default it to the only deployment there is."""
api_key_option = click.option(
    "--api-key",
    metavar="KEY",
    envvar="VLLM_API_KEY",
    show_envvar=True,
    callback=lambda ctx, param, value: remember_secret(value),  # hidden in all it prints
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

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
"""``--json``: the one spelling of output for scripts; valid JSON also when there is nothing."""

model_option = click.option(
    "--model",
    metavar="NAME",
    help="Model name to send. Default: the deployment's, or the only one the server lists.",
)
url_option = click.option(
    "--url", metavar="URL", help="Base URL of the endpoint, instead of a DEPLOYMENT name."
)


def _rate(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--bwlimit``'s value as rsync reads it: a number with an optional K, M or G."""
    if value is not None and not re.fullmatch(r"\d+(\.\d+)?[KMGkmg]?", value):
        raise click.BadParameter(f"{value!r} is not a rate: use e.g. 500M, 2G or 1024 (KiB/s)")
    return value


bwlimit_option = click.option(
    "--bwlimit",
    default=None,
    metavar="RATE",
    callback=_rate,
    help="Cap each node's copy at RATE (rsync's --bwlimit: 500M is 500 MB/s, a bare number "
    "KiB/s), e.g. beside a deployment that serves over the same link.",
)
"""``--bwlimit`` of ``model pull`` and ``sync``: the snapshot's rsync copies."""


def out_option(text: str, *, required: bool = False) -> Callable[[Any], Any]:
    """``--out FOLDER`` (to ``out_dir``): where a command writes what it produces; ``text``
    says what it writes there."""
    return click.option(
        "--out", "out_dir", required=required, type=click.Path(file_okay=False), help=text
    )


def hardware_option(*dest: str, default: str) -> Callable[[Any], Any]:
    """``--hardware NAME`` of ``init`` and ``plan``: the profiles it names come from their own
    files (``tandem.plan.hardware``); ``default`` says what the command picks without it."""
    from tandem.plan.hardware import listed_profiles  # here: other commands skip the planner

    return click.option(
        "--hardware",
        *dest,
        metavar="NAME",
        help=f"Hardware profile: {', '.join(listed_profiles())}. Default: {default}",
    )


force_option = click.option(
    "--force",
    is_flag=True,
    help="Write into an --out folder that holds files tandem did not write (they may be "
    "replaced). Without it such a folder is refused.",
)


def stack(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Several click decorators as one, applied as they would read stacked above a function
    (the first outermost): a command's options declared apart from its function, which then
    stays short enough to read.

    Usage:
        PLAN_OPTIONS = stack(click.option("--json", "as_json", is_flag=True), ...)
    """

    def apply(function: Any) -> Any:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def machine_deployment(recipe: str, cluster_path: str | None) -> Deployment:
    """Load RECIPE on CLUSTER, or on this machine when no cluster is given."""
    return load_deployment(
        recipe,
        cluster_path,
        as_root=os.geteuid() == 0,
        cpu_count=os.cpu_count() or 1,
        gpu_count=gpu_count(),
    )


def gpu_count() -> int:
    """NVIDIA devices this machine exposes (0 on a CPU-only machine)."""
    try:
        return sum(
            1
            for name in os.listdir("/dev")
            if name.startswith("nvidia") and name.removeprefix("nvidia").isdigit()
        )
    except OSError:
        return 0


def given(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The ``values`` of parameters the command line (or an environment variable) set, not
    their defaults: what a cross-check may hold against the user."""
    return {k: v for k, v in values.items() if ctx.get_parameter_source(k) != DEFAULT}


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


# --- options generated from a config model's fields ------------------------------------------

_FROM_MODEL: Any = object()
_OPTIONS: dict[tuple[type[BaseModel], str], str] = {}
"""(model, field) -> the flag ``field_option`` made for it."""


def option_of(model: type[BaseModel], name: str) -> str:
    """The flag that sets ``model``'s field ``name`` (``--token-ids``), so a problem found by
    the model names what the user typed; the field's name when no option sets it."""
    return _OPTIONS.get((model, name), name)


def as_options(values: BaseModel, names: list[str]) -> list[str]:
    """The command line that sets fields ``names`` of ``values`` again through their
    ``field_option`` s (a parent handing its options to a child command).

    Usage:
        as_options(SupervisorPolicy(stall_s=60), ["stall_s"])   # ["--stall=60.0"]
    """
    argv = []
    for name in names:
        flag, value = option_of(type(values), name), getattr(values, name)
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{flag.removeprefix('--')}")
        else:
            argv.append(f"{flag}={value}")
    return argv


def field_option(
    model: type[BaseModel],
    name: str,
    *,
    flag: str | None = None,
    param: str | None = None,
    help: str | None = None,
    default: Any = _FROM_MODEL,
    type: click.ParamType | None = None,
    callback: Callable[[click.Context, click.Parameter, Any], Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A click option for one field of a config model, so the model's default, bounds and
    description are the option's (one of each, STYLE §5: the field's description is the help).

    ``--field-name`` unless ``flag``; the value arrives as ``param`` (default: the field's name).
    The type follows the annotation: a bool is a ``--x/--no-x`` switch, a ``Literal`` a choice,
    an int an ``IntRange`` and a float a ``FloatIn`` with the field's ``ge``/``gt``/``le``/``lt``.
    ``type`` and ``callback`` replace that for a list or a JSON object (whose ``default`` is
    then the model's, written as the text the callback parses); ``default`` replaces the
    model's where the field's default is a nested model's (the eval's fallback sampling).

    Usage:
        @field_option(BenchConfig, "request_timeout_s", flag="--timeout")
    """
    info = model.model_fields[name]
    value = info.get_default(call_default_factory=True) if default is _FROM_MODEL else default
    kind = _bare(info.annotation)
    flag = flag or "--" + name.replace("_", "-")
    _OPTIONS[(model, name)] = flag
    # pydantic keeps Field(ge=...) as annotated_types' Ge(ge=...), Gt, Le, Lt in the metadata
    bounds = {
        k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le", "lt") if hasattr(m, k)
    }
    decls = [flag, param or name]
    options: dict[str, Any] = {"help": help or info.description, "show_default": True}
    if callback is not None:
        options["callback"] = callback
        options["default"] = _as_text(value)
        options["show_default"] = bool(value)
        if isinstance(value, list) or typing.get_origin(kind) is list:
            options["help"] += " Comma-separated; empty for none."
            options["metavar"] = "N,..."
    elif kind is bool:
        decls[0] = f"{flag}/--no-{flag.removeprefix('--')}"
        options["default"] = value
    else:
        options["default"] = value
        options["show_default"] = value is not None
        if type is not None:
            options["type"] = type
            if kind in (int, float):
                options["metavar"] = "N" if kind is int else _float_metavar(name)
        elif typing.get_origin(kind) is typing.Literal:
            options["type"] = click.Choice([str(v) for v in typing.get_args(kind)])
        elif kind is int:
            low = bounds.get("ge", bounds["gt"] + 1 if "gt" in bounds else None)
            high = bounds.get("le", bounds["lt"] - 1 if "lt" in bounds else None)
            options["type"] = click.IntRange(min=low, max=high)
            options["metavar"] = "N"
        elif kind is float:
            options["metavar"] = _float_metavar(name)
            options["type"] = FloatIn(
                min=bounds.get("ge", bounds.get("gt")),
                max=bounds.get("le", bounds.get("lt")),
                min_open="gt" in bounds,
                max_open="lt" in bounds,
            )
    return click.option(*decls, **options)


def _float_metavar(name: str) -> str:
    """What to type for a number field, from the unit its name carries (``timeout_s``)."""
    for suffix, metavar in (("_s", "SECONDS"), ("_ms", "MS"), ("_gib", "GIB"), ("_rps", "RPS")):
        if name.endswith(suffix):
            return metavar
    return "X"


def _bare(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (types.UnionType, typing.Union) and len(args) == 1:
        return args[0]
    return annotation


def _as_text(value: Any) -> str | None:
    """A list or dict default as the text its option's callback parses back."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value) if value else None
    return value


startup_timeout_option = field_option(
    Timeouts,
    "startup_s",
    flag="--timeout",
    param="timeout_s",
    default=None,
    help="Start-up limit in seconds. Default: the recipe's timeouts.startup_s.",
)
"""``--timeout`` of ``up`` and ``service install``: the recipe's ``timeouts.startup_s``."""
