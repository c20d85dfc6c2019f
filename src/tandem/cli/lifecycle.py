"""``tandem up``, ``status``, ``logs``, ``down`` and ``chat``: a deployment's life on its nodes."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click
from rich.table import Table

from tandem import ownership, screen, wire
from tandem.backends.bundle import write_bundle
from tandem.backends.router import LOOPBACK
from tandem.backends.router import argv as router_argv
from tandem.backends.router_node import RouterNode
from tandem.backends.state import (
    DeploymentState,
    fleet_exists,
    list_deployments,
)
from tandem.check import CheckReport
from tandem.cli.check import show_preflight, show_skipped_preflight
from tandem.cli.options import (
    FloatIn,
    api_key_option,
    cluster_option,
    machine_deployment,
    recipe_argument,
    startup_timeout_option,
)
from tandem.cli.supervise import run_supervisor
from tandem.endpoint import Endpoint
from tandem.errors import CheckFailed
from tandem.eval import smoke as smoke_checks
from tandem.operations import fleet, lifecycle, supervisor
from tandem.rankplan import placed_groups
from tandem.readiness import Readiness
from tandem.redact import Redactor
from tandem.report.terminal import show
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_cluster
from tandem.vllm_log import PhaseMark

console = screen.console(highlight=False, soft_wrap=True)
name_argument = click.argument("name", required=False)


def show_phase(mark: PhaseMark) -> None:
    who = f"rank {mark.rank}" if mark.rank is not None else ""
    console.print(
        f"  [dim]{mark.elapsed_s:7.1f}s[/dim]  {who:7}  {mark.phase:16} [dim]{mark.detail}[/dim]"
    )


@click.command("up")
@recipe_argument
@cluster_option
@startup_timeout_option
@click.option("--dry-run", is_flag=True, help="Print what would run, start nothing.")
@click.option(
    "--skip-checks",
    is_flag=True,
    help="Launch without the preflight of `tandem check` (the skip is logged).",
)
@click.option(
    "--supervise",
    is_flag=True,
    help="Stay in the foreground once ready and restart "
    "the whole group when a rank dies (see `tandem supervise`).",
)
@click.option(
    "--smoke",
    is_flag=True,
    help="Once ready, run `tandem eval smoke` (reports in the deployment's state folder, "
    "smoke/) and exit 1 naming the failing check; the deployment stays up to inspect.",
)
def up_command(
    recipe: str,
    cluster_path: str | None,
    timeout_s: float | None,
    dry_run: bool,
    supervise: bool,
    skip_checks: bool = False,
    smoke: bool = False,
) -> None:
    """Launch every rank, workers first, and wait until the model answers.

    The preflight of `tandem check` runs first and refuses to launch on any error.
    Ready means: the leader's port is open, /health is 200, /v1/models lists the model, and a
    real chat completion returns tokens. Start-up phases are shown as the ranks' logs reach
    them. On a timeout or an early exit every rank is stopped and the cause is printed.

    \b
    Examples:
      tandem up tiny-local
      tandem up tiny-local --cluster examples/local-netns.yaml --timeout 600
      tandem up tiny-local --dry-run
      tandem up deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml --supervise
    """
    deployment = machine_deployment(recipe, cluster_path)
    if supervise and deployment.recipe.replicas > 1 and deployment.cluster.transport.value == "k8s":
        raise supervisor.kubernetes_restarts_groups(deployment.name)  # before anything starts
    if dry_run:
        redactor = Redactor.for_caller()
        local = deployment.cluster.transport.value == "local"  # remote commands carry it
        by_group = fleet.launched_by_group(deployment)
        for group in placed_groups(deployment) if by_group else [deployment]:
            _, commands = lifecycle.dry_run(group)
            if group.cluster.transport.value == "k8s":  # one apply creates every rank's pod
                ranks = ", ".join(str(n) for n in sorted(rank.rank for rank, _ in commands))
                screen.echo(
                    f"# {group.name}: ranks {ranks}, all at once (the objects: "
                    "`tandem render --target k8s`)\n"
                    f"{shlex.join(redactor.argv(commands[0][1]))}\n"
                )
                continue
            for rank, argv in commands:
                env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redactor.env(rank.env).items())
                screen.echo(
                    f"# {group.name}: rank {rank.rank} ({rank.role.value}) on {rank.node}\n"
                    + (f"env {env} " if local else "")
                    + f"{shlex.join(redactor.argv(argv))}\n"
                )
        if by_group:
            spec = deployment.recipe.router
            node = RouterNode.of(deployment.cluster, deployment.name)
            argv = router_argv(spec, host=node.address if node else LOOPBACK)
            if node:
                argv = [*shlex.split(node.command), *argv[1:]]
            screen.echo(
                f"# the router{f' on {node.node} (over ssh)' if node else ''}, then each "
                f"group's leader added to it\n{shlex.join(argv)}"
            )
        return
    if fleet.launched_by_group(deployment):
        _up_fleet(
            deployment,
            timeout_s=timeout_s,
            skip_checks=skip_checks,
            smoke=smoke,
            supervise=supervise,
        )
        return
    if skip_checks:
        show_skipped_preflight(deployment)
        _show_launch(deployment, None)
    else:
        console.print(f"preflight of [bold]{deployment.name}[/bold]")
    state, ready = lifecycle.up(
        deployment,
        preflight=not skip_checks,
        timeout_s=timeout_s,
        on_phase=show_phase,
        on_event=show_event,
        on_report=lambda report: _show_launch(deployment, report),
    )
    boot = state.boot
    console.print(
        f"[green]ready[/green] at {state.endpoint}/v1 as model '{state.model}' "
        f"after {state.phases[-1].elapsed_s:.1f} s"
    )
    if boot.compile_cache:
        init = (
            f"; engine init (profile, compile, warm-up) {boot.engine_init_s:.1f} s"
            if boot.engine_init_s is not None
            else ""
        )
        said = {
            "warm": "compile caches loaded",
            "cold": "compile caches written",
            "recompiled": "vLLM could not load its compile cache; kernel caches reused",
        }
        console.print(f"  start: {boot.compile_cache} ({said.get(boot.compile_cache, '')}){init}")
    elif deployment.recipe.engine.serve.enforce_eager:
        console.print("  start: eager (enforce_eager: no torch.compile, no compile cache to warm)")
    if boot.kv_cache_tokens:
        console.print(
            f"  KV cache: {boot.kv_cache_tokens:,} tokens, "
            f"{boot.available_kv_cache_gib} GiB available, max concurrency "
            f"{boot.max_concurrency}x at {boot.max_concurrency_tokens_per_request:,} "
            "tokens per request"
        )
    console.print(f"  {first_answer(ready)}")
    if smoke:
        _smoke(state)
    if supervise:
        run_supervisor(state.name)


def _up_fleet(
    deployment: Deployment,
    *,
    timeout_s: float | None,
    skip_checks: bool,
    smoke: bool,
    supervise: bool,
) -> None:
    """``tandem up`` of a recipe with replicas: each group as a deployment of its own, then the
    router in front (``tandem.operations.fleet``)."""
    if smoke or supervise:
        raise click.UsageError(
            "--smoke and --supervise take one group so far; run them on a group (NAME-gG)"
        )
    started = fleet.up(
        deployment,
        preflight=not skip_checks,
        timeout_s=timeout_s,
        on_phase=show_phase,
        on_event=show_event,
        on_report=show_preflight,
    )
    assert started.router is not None
    console.print(
        f"[green]ready[/green] at {started.router.url}/v1 as model '{started.model}': "
        f"{len(started.groups)} groups behind vllm-router {started.router.version} "
        f"({started.router.policy})"
    )


def _smoke(state: DeploymentState) -> None:
    """``tandem eval smoke`` on the deployment just started.

    Raises:
        CheckFailed: a check failed (the deployment stays up).
    """
    out = ownership.output_folder(state.directory.path / "smoke", force=True)
    report = smoke_checks.run_smoke(
        smoke_checks.target_of(state),
        out,
        api_key=os.environ.get(wire.VLLM_API_KEY),  # the key the ranks were started with
        on_result=lambda r: console.print(
            f"  smoke {r.check:<12} {r.outcome.value:<15} {r.summary}"
        ),
    )
    failed = [c.check for c in report.checks if c.outcome is smoke_checks.Outcome.FAIL]
    if failed:
        raise CheckFailed(
            f"'{state.name}' is up, but its smoke check failed: {', '.join(failed)}",
            hint=f"read {out / smoke_checks.REPORT_MD}; `tandem down {state.name}` stops it",
        )


def first_answer(ready: Readiness) -> str:
    """The readiness answer as `up` shows it.

    A random-weight model of a real shape draws ids its small tokenizer has no text for; an
    empty string there reads like a failure, so the tokens are counted instead.
    """
    if ready.answer or not ready.completion_tokens:
        return f"first answer ({ready.completion_tokens} tokens): {ready.answer!r}"
    return f"first answer: {ready.completion_tokens} tokens that decode to no text"


def _show_launch(deployment: Deployment, report: CheckReport | None) -> None:
    """The preflight's findings (when it ran), then, when nothing refuses the launch, what is
    launched where."""
    if report is not None:
        show_preflight(report)
        if not report.ok:
            return
    cluster = deployment.cluster
    console.print(
        f"[bold]{deployment.name}[/bold]: {len(cluster.nodes)} rank(s), world size "
        f"{deployment.world_size}, on '{cluster.name}' ({cluster.transport.value}"
        f"{', ' + cluster.local.isolation.value if cluster.transport.value == 'local' else ''})"
    )


def show_event(text: str) -> None:
    console.print(f"  [dim]{text}[/dim]")


@click.command("status")
@name_argument
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--canary-timeout",
    "canary_timeout_s",
    type=FloatIn(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds a 1-token canary completion may "
    "take on an idle server before the engine counts as stalled.",
)
def status_command(name: str | None, as_json: bool, canary_timeout_s: float) -> None:
    """Show a deployment's verdict, endpoint and each rank's health.

    NAME defaults to the only deployment there is. The verdict comes from the health model
    (every process of every rank alive and running, the leader's /health, forward progress
    or a 1-token canary, error lines in the rank logs) and names the rank and the evidence.

    \b
    Exit status:
      0  healthy     every rank alive, the API answers, the engine makes progress
      3  starting    not ready yet
      4  degraded    the API answers but a rank lost a process or logged a fatal error
      5  stalled     alive but no progress (a stopped process, a canary past its deadline)
      6  down        the leader is gone or does not answer /health
      2  error       no such deployment, unreadable state

    \b
    Examples:
      tandem status
      tandem status tiny-local --json
    """

    status = fleet.status(name, canary_timeout_s=canary_timeout_s)
    if as_json:
        screen.echo(status.model_dump_json(indent=2))
    else:
        _print_status(status)
    if status.verdict.exit_code:
        raise click.exceptions.Exit(status.verdict.exit_code)


def _print_status(status: lifecycle.DeploymentStatus) -> None:
    colour = status.verdict.colour
    if status.upgrade_interrupted:
        console.print(f"[yellow]{status.upgrade_interrupted}[/yellow]")
    revision = f" revision {status.revision}" if status.revision is not None else ""
    console.print(
        f"[bold]{status.name}[/bold]{revision} ({status.backend}) {status.endpoint}/v1 "
        f"model '{status.model}': [{colour}]{status.verdict.value}[/{colour}]"
        + (
            f" — {'rank ' + str(status.rank) + ': ' if status.rank is not None else ''}"
            f"{status.reason}"
            if status.verdict.value != "healthy"
            else ""
        )
    )
    if status.evidence and status.verdict.value != "healthy":
        console.print(f"  [dim]evidence: {status.evidence}[/dim]")
    if status.router is not None:
        _print_groups(status)
        return
    table = Table("rank", "role", "node", "address", "processes", "health")
    for r in status.ranks:
        shade = r.health.state.colour
        procs = (
            ", ".join(
                f"{p.name} {p.pid}{' (' + p.state + ')' if p.state in 'TtDZ' else ''}"
                for p in r.processes
            )
            or "none"
        )
        table.add_row(
            str(r.rank),
            r.role,
            r.node,
            r.address,
            procs,
            f"[{shade}]{r.health.state}[/{shade}]"
            + (f" {r.health.reason}" if r.health.reason else ""),
        )
    show(table, console)
    for g in status.groups if len(status.groups) > 1 else []:  # a LeaderWorkerSet's replicas
        console.print(
            f"  group {g.group} ({g.name}, ranks {', '.join(str(r.rank) for r in g.ranks)}): "
            f"[{g.verdict.colour}]{g.verdict.value}[/{g.verdict.colour}]"
            + (f" — {g.reason}" if g.reason else "")
        )
    if status.planned and status.planned.comparison:
        for c in (
            status.planned.comparison.kv_pool_tokens,
            status.planned.comparison.kv_pool_gib,
            status.planned.comparison.max_concurrency,
        ):
            console.print(
                f"  planned vs actual {c.name}: {c.planned:,} vs {c.measured:,} "
                f"({c.error_pct:+.2f}%)"
                if c.error_pct is not None
                else f"  planned {c.name}: {c.planned}"
            )
    elif status.planned and status.planned.unavailable:
        console.print(f"  [dim]planned vs actual: {status.planned.unavailable}[/dim]")


def _print_groups(status: lifecycle.DeploymentStatus) -> None:
    """The router and its members, then each group's verdict and ranks."""
    router = status.router
    assert router is not None
    console.print(
        f"  router vllm-router {router.version} ({router.policy}) pid {router.pid}: "
        + ("running" if router.running else "[bold red]not running[/bold red]")
        + f", {len(router.members)} member(s)"
    )
    table = Table("group", "deployment", "leader", "in rotation", "verdict", "ranks")
    for g in status.groups:
        colour = g.verdict.colour
        table.add_row(
            str(g.group),
            g.name,
            g.endpoint,
            "yes" if g.member else "no",
            f"[{colour}]{g.verdict.value}[/{colour}]" + (f" {g.reason}" if g.reason else ""),
            ", ".join(f"{r.rank} {r.health.state}" for r in g.ranks) or "none",
        )
    show(table, console)


@click.command("logs")
@name_argument
@click.option(
    "--rank", type=click.IntRange(min=0), help="Only this rank. Default: all, prefixed by rank."
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until Ctrl-C.")
@click.option(
    "--tail",
    type=click.IntRange(min=0),
    default=None,
    help="Only the last N lines of each log (0: none, then --follow).",
)
@click.option(
    "--bundle",
    "bundle_path",
    type=click.Path(path_type=Path),
    default=None,
    is_flag=False,
    flag_value=Path("."),
    help="Write a support archive instead (resolved "
    "recipe, versions, last log lines of every rank, environment with secrets removed) "
    "to this file or folder (default: the current folder).",
)
def logs_command(
    name: str | None, rank: int | None, follow: bool, tail: int | None, bundle_path: Path | None
) -> None:
    """Show the ranks' logs, each line prefixed with its rank.

    \b
    Examples:
      tandem logs --rank 1 --tail 50
      tandem logs tiny-local -f
      tandem logs tiny-local --bundle /tmp
    """
    if bundle_path is not None:
        console.print(f"wrote {write_bundle(name, bundle_path)}")
        return
    redactor = Redactor.for_caller()
    for number, line in lifecycle.log_lines(name, rank=rank, follow=follow, tail=tail):
        screen.echo(f"[rank {number}] {redactor.text(line)}")


@click.command("down")
@name_argument
@click.option(
    "--purge-caches",
    is_flag=True,
    help="Also remove every rank's compile, JIT and "
    "autotune caches, so the next start is cold on every rank. Works on a deployment "
    "that is already down too (give its NAME, and --cluster for ssh nodes).",
)
@cluster_option
def down_command(name: str | None, purge_caches: bool, cluster_path: str | None) -> None:
    """Stop every rank and remove what up created (processes, namespaces, run files).

    Logs stay under the deployment's state folder, and each rank's compile caches stay on its
    node, so the next `tandem up` starts warm.

    \b
    Examples:
      tandem down
      tandem down tiny-local
      tandem down tiny-local --purge-caches
      tandem down deepseek-v4-flash --purge-caches --cluster examples/dgx-spark-pair.yaml
    """
    if purge_caches and name and name not in list_deployments():
        cluster = load_cluster(cluster_path) if cluster_path else None
        lifecycle.purge_compile_caches(name, cluster, on_event=show_event)  # says what it found
        return
    if name is not None and fleet_exists(ownership.check_name(name)):
        fleet.down(name, purge_caches=purge_caches, on_event=show_event)
        console.print(f"[bold]{name}[/bold] is down: the router and every group")
        return
    state = lifecycle.down(name, purge_caches=purge_caches, on_event=show_event)
    if state is None:
        console.print("no deployment was running; removed what killed commands left")
        return
    console.print(f"[bold]{state.name}[/bold] is down")


@click.command("chat")
@click.argument("message")
@click.option("--name", "name", help="Deployment name. Default: the only one.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@api_key_option
def chat_command(message: str, name: str | None, max_tokens: int, api_key: str | None) -> None:
    """Send one chat message to a deployment and print the answer and token counts.

    \b
    Examples:
      tandem chat "What is tensor parallelism?"
      tandem chat "Hello" --name tiny-local --max-tokens 16
    """
    endpoint, model = fleet.front_door(name)  # a deployment with replicas: its router
    messages = [{"role": "user", "content": message}]
    with Endpoint(endpoint, api_key=api_key) as server:
        data = server.chat(model, messages, timeout_s=300, max_tokens=max_tokens, temperature=0)
    usage = data.get("usage", {})
    console.print(f"[bold]{model}[/bold]: {data['choices'][0]['message'].get('content')!r}")
    console.print(
        f"  [dim]{usage.get('prompt_tokens')} prompt + {usage.get('completion_tokens')}"
        f" completion tokens, finish_reason {data['choices'][0].get('finish_reason')}"
        "[/dim]"
    )
