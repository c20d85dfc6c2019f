"""``tandem check``: preflight the nodes of a deployment; exit 1 when any finding is an error."""

from __future__ import annotations

import logging
import os
import re

import click
from rich.markup import escape
from rich.table import Table

from tandem import screen, wire
from tandem.check import CheckReport, Severity
from tandem.check.fabric import DEFAULT_PORT
from tandem.check.rules.network import open_api_finding
from tandem.cli.options import PORT, cluster_option, machine_deployment, recipe_argument
from tandem.errors import CheckFailed
from tandem.operations.preflight import run_check
from tandem.report.terminal import show

console = screen.console(highlight=False)
logger = logging.getLogger("tandem.check")
_COLOUR = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB)?", re.IGNORECASE)
_UNIT_BYTES = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
MAX_FABRIC_BYTES = 4 << 30
"""The largest all-reduce message the fabric test sends: beyond it a buffer is the test."""


class ByteSizes(click.ParamType):
    """``1KiB,64KiB,1MiB`` or plain bytes ``1024,65536`` -> a list of byte counts, each from
    1 byte to ``MAX_FABRIC_BYTES``; the units are the binary ones the help itself shows."""

    name = "sizes"

    def convert(self, value, param, ctx) -> list[int]:
        if isinstance(value, list):
            return value
        sizes = []
        for part in str(value).split(","):
            match = _SIZE.fullmatch(part.strip())
            if not match:
                self.fail(
                    f"'{part.strip()}' is not a size; write bytes or a number with B, KiB, MiB "
                    "or GiB, e.g. 1KiB,64KiB,1MiB",
                    param,
                    ctx,
                )
            number, unit = match.groups()
            size = int(number) * _UNIT_BYTES[(unit or "").lower()]
            if not 1 <= size <= MAX_FABRIC_BYTES:
                self.fail(
                    f"'{part.strip()}' is not between 1 B and {MAX_FABRIC_BYTES >> 30} GiB",
                    param,
                    ctx,
                )
            sizes.append(size)
        return sizes


@click.command("check")
@recipe_argument
@cluster_option
@click.option(
    "--fabric",
    is_flag=True,
    help="Also run an all-reduce across the ranks with "
    "their environment (Gloo on CPU, NCCL on GPUs) and report bus bandwidth, "
    "small-message latency and the NCCL transport.",
)
@click.option(
    "--fabric-port",
    type=PORT,
    default=DEFAULT_PORT,
    show_default=True,
    help="Rendezvous port of the fabric test on the leader.",
)
@click.option(
    "--fabric-sizes",
    type=ByteSizes(),
    default=None,
    metavar="SIZE,...",
    help="Message sizes of the fabric test, in bytes or with a binary unit: e.g. "
    "1KiB,64KiB,1MiB. Default: 1 KiB..256 MiB (NCCL), 1 KiB..16 MiB (Gloo). A size of "
    "1GiB or more also judges a DGX Spark pair's bandwidth against the >= 20 GB/s a pair reaches.",
)
@click.option(
    "--rehash",
    is_flag=True,
    help="Read every snapshot file on every node again and check it against the id the Hub "
    "gave it (by default a file verified before and unchanged since is not read again).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON for scripts.")
def check_command(
    recipe: str,
    cluster_path: str | None,
    fabric: bool,
    fabric_port: int,
    fabric_sizes: list[int] | None,
    rehash: bool,
    as_json: bool,
) -> None:
    """Preflight the nodes: refuse to launch on a real fault.

    Probes every node (OS, kernel, driver, CUDA, GPUs, memory, NICs, RDMA devices and their
    RoCE v2 GID tables, /dev/shm, the desktop, images, the model snapshot, ports, vLLM) and
    judges the facts: version skew between nodes, a missing or different snapshot, interfaces
    down, MTU mismatch, a wrong GID index, known-bad variables, ports taken, a plan that does
    not fit, an API open beyond loopback without a key, and more. Exits
    with status 1 when any finding is an error; `tandem up` runs the same checks first.

    \b
    Examples:
      tandem check tiny-local
      tandem check tiny-local --fabric --json
      tandem check deepseek-v4-flash-dspark --cluster examples/dgx-spark-eks.yaml
    """
    deployment = machine_deployment(recipe, cluster_path)
    report = run_check(
        deployment,
        fabric=fabric,
        fabric_port=fabric_port,
        fabric_sizes=fabric_sizes,
        rehash=rehash,
        on_event=(lambda text: None) if as_json else _show_event,
    )
    if as_json:
        screen.echo(report.model_dump_json(indent=2, include={"nodes", "findings", "fabric"}))
    else:
        show_report(report)
    if not report.ok:
        raise CheckFailed(
            f"{len(report.errors)} error(s) in the preflight of '{deployment.name}'",
            hint=report.refusal_hint,
        )


def show_preflight(report: CheckReport) -> None:
    """The findings of the preflight ``tandem up`` runs first (``tandem.operations.lifecycle.up``
    refuses to launch on an error among them)."""
    if report.findings:
        show_report(report, nodes=False)


def show_skipped_preflight(deployment) -> None:
    """``tandem up --skip-checks``: nothing is probed; the skip is logged (``tandem.check``
    logger, stderr), and an API open beyond loopback without a key is still said."""
    logger.warning("preflight checks skipped for '%s' (--skip-checks)", deployment.name)
    console.print("[yellow]preflight skipped (--skip-checks)[/yellow]")
    finding = open_api_finding(deployment, bool(os.environ.get(wire.VLLM_API_KEY)))
    if finding:
        console.print(f"[yellow]{escape(finding.render())}[/yellow]")


def _show_event(text: str) -> None:
    console.print(f"  [dim]{text}[/dim]")


def show_report(report: CheckReport, *, nodes: bool = True) -> None:
    """Nodes as a table of key facts, then each finding in pip's diagnostic shape."""
    if nodes:
        _show_nodes(report)
    _show_findings(report)


def _show_nodes(report: CheckReport) -> None:
    table = Table("node", "kernel", "driver / CUDA", "GPUs", "mem avail", "vLLM", "/dev/shm")
    for name, facts in report.nodes.items():
        if "probe_error" in facts:
            table.add_row(name, f"[red]{escape(facts['probe_error'])}[/red]", "", "", "", "", "")
            continue
        gpu = facts.get("gpu") or {}
        memory = (facts.get("memory") or {}).get("available_bytes")
        shm = (facts.get("shm") or {}).get("total_bytes")
        table.add_row(
            name,
            (facts.get("system") or {}).get("kernel") or "?",
            f"{gpu.get('driver_version') or '-'} / {gpu.get('cuda_version') or '-'}",
            ", ".join(g["name"] for g in gpu.get("gpus", [])) or "none",
            f"{memory / 2**30:.1f} GiB" if memory else "?",
            (facts.get("software") or {}).get("vllm_version") or "-",
            f"{shm / 2**30:.1f} GiB" if shm else "?",
        )
    show(table, console)
    fabric = report.fabric
    if fabric and fabric.get("sizes"):
        sizes = Table(
            "bytes",
            "time (us)",
            "algbw (GB/s)",
            "busbw (GB/s)",
            title=f"fabric: {fabric['backend']}, {fabric['world_size']} ranks",
        )
        for row in fabric["sizes"]:
            sizes.add_row(
                f"{row['bytes']:,}",
                f"{row['time_us']:.1f}",
                f"{row['algbw_gbps']:.3f}",
                f"{row['busbw_gbps']:.3f}",
            )
        show(sizes, console)


def _show_findings(report: CheckReport) -> None:
    for finding in report.findings:
        colour = _COLOUR[finding.severity]
        where = f" on {finding.node}" if finding.node else ""
        console.print(
            f"[{colour}]{finding.severity.value}[/{colour}]"
            f"{escape(f'[{finding.rule}]{where}: {finding.message}')}"
        )
        console.print(f"  [dim]evidence:[/dim] {escape(finding.evidence)}")
        console.print(f"  [dim]fix:[/dim] {escape(finding.fix)}")
    errors, warnings = (
        len(report.errors),
        sum(f.severity is Severity.WARNING for f in report.findings),
    )
    status = "[green]ok[/green]" if report.ok else "[red]refused[/red]"
    console.print(f"{status}: {errors} error(s), {warnings} warning(s)")
