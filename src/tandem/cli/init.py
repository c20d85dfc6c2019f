"""``tandem init``: write a recipe and a cluster inventory for the user's model and nodes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from tandem import screen
from tandem.cli.layout import SectionedCommand
from tandem.cli.options import PORT, gpu_count, hardware_option, stack
from tandem.operations.drafting import InitRequest, default_name, draft, write
from tandem.redact import Redactor

INIT_SECTIONS = {
    "Model": ["model", "config_path", "max_model_len"],
    "Nodes": ["hosts", "ssh_user", "ranks", "gpus", "hardware", "subnet"],
    "Ports": ["port", "master_port"],
    "Output": ["out_dir", "dry_run", "as_json"],
}
"""``init --help``'s headings."""


INIT_OPTIONS = stack(
    click.option(
        "--model",
        metavar="REPO|FOLDER",
        help="The model: a Hub repo id (ORG/NAME) or a local snapshot folder. Asked when left out "
        "on a terminal.",
    ),
    click.option(
        "--hosts",
        metavar="HOST,...",
        help="The nodes over ssh, in rank order (the first leads): addresses or ~/.ssh/config "
        "aliases, each optionally NAME=HOST. Default: this machine.",
    ),
    click.option("--ssh-user", metavar="USER", help="User for ssh. Default: ssh's own."),
    click.option(
        "--ranks",
        type=click.IntRange(min=1),
        metavar="N",
        default=2,
        show_default=True,
        help="Nodes on this machine, without --hosts.",
    ),
    click.option(
        "--gpus",
        type=click.IntRange(min=1),
        metavar="N",
        help="GPUs per node. Default: what the nodes report.",
    ),
    hardware_option(default="from the nodes' GPUs (cpu without any)."),
    click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        help="The model's config.json, for a model not downloaded yet (its Hub page's Files).",
    ),
    click.option(
        "--max-model-len",
        type=click.IntRange(min=1),
        metavar="TOKENS",
        help="Longest request. Default: the model's, at most 8,192 on CPUs and 32,768 on GPUs, "
        "lowered until it fits.",
    ),
    click.option(
        "--port", type=PORT, metavar="PORT", default=8000, show_default=True, help="API port."
    ),
    click.option(
        "--master-port",
        type=PORT,
        metavar="PORT",
        default=29501,
        show_default=True,
        help="Rendezvous port on the leader.",
    ),
    click.option(
        "--subnet",
        default="10.77.0.0/24",
        show_default=True,
        metavar="CIDR",
        help="This machine's nodes' subnet (as root each node is a network namespace on it).",
    ),
    click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help="Folder to write NAME.yaml and NAME-cluster.yaml into.",
    ),
)
"""What ``init`` asks for: the fields of ``InitRequest`` but the name and this machine's."""


@click.command("init", cls=SectionedCommand, sections=INIT_SECTIONS)
@click.argument("name", required=False)
@INIT_OPTIONS
@click.option("--dry-run", is_flag=True, help="Print both files, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def init_command(
    name: str | None, dry_run: bool, as_json: bool, out_dir: Path, **fields: Any
) -> None:
    """Write a recipe and a cluster for your model and nodes, planned so that they fit.

    The model's config.json (from the cache, a folder, or --config) decides the parallelism
    (tensor parallel when the heads split over every device, else pipeline parallel) and the
    planner the longest request that fits. Reachable ssh nodes are asked for their interfaces
    and GPUs. Without --model on a terminal, init asks for the model, the hosts and the name.
    Nothing is replaced: a file already there is refused.

    \b
    Examples:
      tandem init --model tandem-org/gemma3-270m --dry-run
      tandem init my-qwen --model Qwen/Qwen3-0.6B --config config.json --hosts 10.0.0.1,10.0.0.2
      tandem init --model ~/models/llama --hosts spark-a,spark-b --hardware gb10 --out deploy/
    """
    if fields["model"] is None:
        fields["model"], fields["hosts"], name = ask(name)
    hosts = fields.pop("hosts") or ""
    request = InitRequest(
        name=name,
        hosts=[h.strip() for h in hosts.split(",") if h.strip()],
        cpu_count=os.cpu_count() or 1,
        gpu_count=gpu_count(),
        **fields,
    )
    said = Redactor.for_caller()
    found = draft(request, on_event=lambda text: screen.echo(f"  {said.text(text)}", err=True))
    for note in found.notes if not as_json else []:
        screen.echo(f"  {said.text(note)}", err=True)
    if dry_run:
        if as_json:
            screen.echo(found.model_dump_json(indent=2))
            return
        screen.echo(f"# {found.name}.yaml\n{found.recipe_yaml}\n# {found.name}-cluster.yaml")
        screen.echo(found.cluster_yaml, nl=False)
        return
    recipe, cluster = write(found, out_dir)
    if as_json:
        data = found.model_dump(mode="json", exclude={"recipe_yaml", "cluster_yaml"})
        data |= {"recipe_file": str(recipe), "cluster_file": str(cluster)}
        screen.echo(said.text(json.dumps(data, indent=2)))
        return
    screen.echo(
        f"wrote {recipe} and {cluster}: TP={found.tensor_parallel_size} "
        f"PP={found.pipeline_parallel_size} on {found.hardware}, max_model_len "
        f"{found.max_model_len:,}, KV pool {found.kv_pool_tokens:,} tokens (planned: fits)"
    )
    screen.echo(
        f"next: tandem check {recipe} --cluster {cluster}\n"
        f"      tandem up {recipe} --cluster {cluster}"
    )


def ask(name: str | None) -> tuple[str, str, str]:
    """The model, the hosts and the name, asked on the terminal.

    Raises:
        click.UsageError: there is no terminal to ask on.
    """
    if not on_terminal():
        raise click.UsageError("pass --model (no terminal to ask on)")
    model = click.prompt("Model (a Hub repo id such as Qwen/Qwen3-0.6B, or a folder)")
    hosts = click.prompt(
        "Hosts over ssh, comma-separated, in rank order (empty: this machine)",
        default="",
        show_default=False,
    )
    return model, hosts, click.prompt("Deployment name", default=name or default_name(model))


def on_terminal() -> bool:
    """Whether init may ask: a person types on standard input."""
    return sys.stdin.isatty()
