"""``tandem plan``: memory, KV pool, concurrency and decode roofline of a deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tandem import screen
from tandem.cli import ExitCode
from tandem.cli.layout import HELP_OPTIONS
from tandem.cli.options import (
    SHARE,
    cluster_option,
    field_option,
    hardware_option,
    machine_deployment,
    recipe_argument,
    stack,
)
from tandem.errors import PlanError
from tandem.plan.calibrate import figures_from_log, planned_vs_measured, serves_model
from tandem.plan.hardware import listed_profiles
from tandem.plan.planner import for_cpu, plan_for
from tandem.rankplan import template_plan
from tandem.report.plan import print_plan
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import ModelSource, ServeOptions
from tandem.vllm_log import BootFigures, logged_model

PLAN_OPTIONS = stack(
    click.option(
        "--model-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Local snapshot (config.json + *.safetensors). Default: the HF cache, else "
        "the data tandem ships for the built-in DeepSeek recipes' models.",
    ),
    click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The model's config.json alone (from its Hub page): plan before downloading "
        "anything, the weights counted from the architecture.",
    ),
    hardware_option(
        "hardware_name",
        default="from the cluster (DGX Spark names -> gb10, a local CPU cluster -> cpu).",
    ),
    field_option(
        ServeOptions,
        "max_model_len",
        default=None,
        help="Plan at this max_model_len instead of the recipe's.",
    ),
    field_option(
        ServeOptions,
        "gpu_memory_utilization",
        param="utilization",
        default=None,
        help="Plan at this utilization instead of the recipe's.",
    ),
    click.option(
        "--context",
        "context_tokens",
        type=click.IntRange(min=1),
        default=8192,
        show_default=True,
        help="Context length, tokens, for the decode roofline.",
    ),
    click.option(
        "--acceptance",
        type=SHARE,
        default=0.5,
        show_default=True,
        help="Draft-token acceptance rate for the speculative roofline, 0-1.",
    ),
    click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        help="Sequences for the batched roofline. Default: max_num_seqs.",
    ),
    click.option(
        "--calibrate",
        "log_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="A real vLLM boot log: report the planner's error against it.",
    ),
    click.option(
        "--no-shipped-calibration",
        is_flag=True,
        help="Do not calibrate on the measured boots shipped with tandem.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON."),
)
"""``plan``'s options (its function stays readable below them)."""


@click.command("plan", context_settings=HELP_OPTIONS)
@recipe_argument
@cluster_option
@PLAN_OPTIONS
def plan_command(recipe: str, cluster_path: str | None, as_json: bool, **options: Any) -> None:
    """Predict memory per rank, the KV pool in tokens, concurrency, fit and decode speed.

    The figures follow vLLM's own accounting; every estimate says so. With --calibrate the
    plan is compared with the figures a real boot logged. Exit status 1 when it does not fit,
    with each change that makes it fit. A recipe for GPUs is planned on its cluster
    (--cluster) or hardware (--hardware), never on this machine's CPUs by default.

    \b
    Examples:
      tandem plan deepseek-v4-flash-dspark --cluster examples/dgx-spark-eks.yaml
      tandem plan smollm2-local --json
      tandem plan deepseek-v4-flash --hardware h200 --max-model-len 32768
      tandem plan examples/recipes/gpu-llama8b.yaml --hardware h100 --config config.json
      tandem plan smollm2-local --calibrate rank0.log   # a real boot of it: the error
    """
    deployment = machine_deployment(recipe, cluster_path)
    template_plan(deployment)  # what `render` and `up` refuse, plan refuses the same
    hardware, log_path = options.pop("hardware_name"), options.pop("log_path")
    if cluster_path is None and hardware is None:
        refuse_this_machine(deployment)
    figures = _boot_figures(log_path, deployment.recipe.model) if log_path else None
    plan = plan_for(
        deployment,
        model_dir=options.pop("model_dir"),
        config_path=options.pop("config_path"),
        hardware=hardware,
        gpu_memory_utilization=options.pop("utilization"),
        acceptance_rate=options.pop("acceptance"),
        use_shipped_boots=not options.pop("no_shipped_calibration"),
        **options,  # max_model_len, context_tokens, concurrency
    )
    if figures is not None:
        plan.calibration = planned_vs_measured(plan, figures, str(log_path))
    if as_json:
        screen.echo(plan.model_dump_json(indent=2))
    else:
        print_plan(plan)
    if not plan.fits:
        raise click.exceptions.Exit(ExitCode.CHECK_FAILED)


def refuse_this_machine(deployment: Deployment) -> None:
    """Refuse to plan a GPU recipe on this machine's CPUs, where no cluster or hardware says
    otherwise: a plan there (a negative KV pool on a 16 GiB profile) answers nothing asked.

    Raises:
        PlanError: the recipe is not one for vLLM's CPU backend.
    """
    if for_cpu(deployment.recipe):
        return
    raise PlanError(
        f"'{deployment.name}' is a recipe for GPUs (its env has no VLLM_CPU_KVCACHE_SPACE), "
        "and without --cluster it would be planned on this machine's CPUs",
        field="--cluster",
        hint="pass --cluster with the inventory of the nodes it runs on (e.g. "
        f"examples/dgx-spark-pair.yaml), or --hardware {'|'.join(listed_profiles(cpu=False))}",
    )


def _boot_figures(log_path: Path, model: ModelSource) -> BootFigures:
    """The memory figures of ``--calibrate``'s boot log, which must be a boot of ``model``
    that got past KV cache sizing: another model's figures would calibrate nothing.

    Raises:
        PlanError: the log cannot be read, has no KV cache size, or boots another model (or
            names none).
    """
    try:
        text = log_path.read_text(errors="replace")
    except OSError as exc:
        raise PlanError(
            f"cannot read the log: {exc.strerror}", file=str(log_path), field="--calibrate"
        ) from exc
    figures = figures_from_log(text)
    if figures.kv_cache_tokens is None:
        raise PlanError(
            "no 'KV cache size: N tokens' line in the log",
            file=str(log_path),
            field="--calibrate",
            hint="pass the leader's log of a boot that got past KV cache sizing",
        )
    logged = logged_model(text)
    if logged is None or not serves_model(logged, model):
        raise PlanError(
            f"the log is a boot of '{logged}', not of the deployment's model "
            f"'{model.path or model.repo_id}'"
            if logged
            else "no line of the log names the model it booted",
            file=str(log_path),
            field="--calibrate",
            hint=f"pass a boot log of '{model.repo_id}' (the leader's rank0.log of this "
            "deployment), whole from its first line, where vLLM names the model",
        )
    return figures
