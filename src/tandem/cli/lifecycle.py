"""``tandem up``, ``status``, ``logs``, ``down`` and ``chat``: a deployment's life on its nodes."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import click
from rich.table import Table

from tandem import ownership, screen, wire
from tandem.backends.bundle import write_bundle
from tandem.backends.router import LOOPBACK, PACKAGE, executable
from tandem.backends.router_node import RouterNode
from tandem.backends.state import DeploymentState, list_deployments, load_state
from tandem.check import CheckReport
from tandem.cli.check import show_preflight, show_skipped_preflight
from tandem.cli.options import (
    FloatIn,
    api_key_option,
    cluster_option,
    deployment_argument,
    json_option,
    machine_deployment,
    recipe_argument,
    startup_timeout_option,
)
from tandem.cli.supervise import run_supervisor
from tandem.endpoint import Endpoint
from tandem.errors import CheckFailed, StateError
from tandem.eval import smoke as smoke_checks
from tandem.operations import admission, lifecycle
from tandem.operations.front import front_door_line
from tandem.operations.health import RankCondition, Verdict
from tandem.operations.listing import DeploymentLine, every_deployment, every_ledger
from tandem.plan.ledger import HostLedger
from tandem.plan.memory import GIB
from tandem.readiness import Readiness
from tandem.redact import Redactor
from tandem.report.terminal import show
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_cluster
from tandem.upgrade import last_reference
from tandem.vllm_log import PhaseMark

console = screen.console(highlight=False, soft_wrap=True)


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
    if dry_run:
        _print_dry_run(deployment, supervise=supervise)
        return
    if supervise:  # what `up` itself checks, and the supervisor's own refusal, before it starts
        lifecycle.check_launchable(deployment, supervise=True, ports=False)
    if skip_checks:
        show_skipped_preflight(deployment)
        _show_launch(deployment, None)
    else:
        console.print(f"preflight of [bold]{deployment.name}[/bold]")
    state, readiness = lifecycle.up(
        deployment,
        preflight=not skip_checks,
        timeout_s=timeout_s,
        on_phase=show_phase,
        on_event=show_event,
        on_report=lambda report: _show_launch(deployment, report),
    )
    _show_ready(state, readiness, enforce_eager=deployment.recipe.engine.serve.enforce_eager)
    if smoke:
        _smoke(state)
    if supervise:
        run_supervisor(state.name)


def _print_dry_run(deployment: Deployment, *, supervise: bool) -> None:
    """What ``up`` would run, after every check it makes before it touches anything."""
    redactor = Redactor.for_caller()
    local = deployment.cluster.transport.value == "local"  # remote commands carry it
    launches = lifecycle.dry_run(deployment)
    if supervise:
        lifecycle.check_launchable(deployment, supervise=True, ports=False)
    for line in admission.admit(deployment).lines():
        screen.echo(f"# {line}")
    for part, _, commands in launches:
        if part.cluster.transport.value == "k8s":  # one apply creates every rank's pod
            ranks = ", ".join(str(n) for n in sorted(rank.rank for rank, _ in commands))
            screen.echo(
                f"# {part.name}: ranks {ranks}, all at once (the objects: "
                "`tandem render --target k8s`)\n"
                f"{shlex.join(redactor.argv(commands[0][1]))}\n"
            )
            continue
        for rank, argv in commands:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redactor.env(rank.env).items())
            screen.echo(
                f"# {part.name}: rank {rank.rank} ({rank.role.value}) on {rank.node}\n"
                + (f"env {env} " if local else "")
                + f"{shlex.join(redactor.argv(argv))}\n"
            )
    if len(launches) > 1:
        spec = deployment.recipe.router
        node = RouterNode.of(deployment.cluster, deployment.name)
        argv = spec.argv(
            host=node.address if node else LOOPBACK,
            program=shlex.split(node.command) if node else [executable() or PACKAGE],
        )
        screen.echo(
            f"# the router{f' on {node.node} (over ssh)' if node else ''}, then each "
            f"group's leader added to it\n{shlex.join(argv)}"
        )


def _show_ready(state: DeploymentState, readiness: list[Readiness], *, enforce_eager: bool) -> None:
    """Where it answers, and each group's start: compile caches, KV cache, first answer."""
    if state.router is not None:
        console.print(
            f"[green]ready[/green] at {state.router.url}/v1 as model '{state.model}': "
            f"{len(state.groups)} groups behind vllm-router {state.router.version} "
            f"({state.router.policy})"
        )
    else:
        phases = state.groups[0].phases
        console.print(
            f"[green]ready[/green] at {state.endpoint}/v1 as model '{state.model}' "
            f"after {phases[-1].elapsed_s:.1f} s"
        )
    if door := front_door_line():
        console.print(f"  also behind the {door}")
    for group, ready in zip(state.groups, readiness):
        who = f"group {group.group}: " if len(state.groups) > 1 else ""
        boot = group.boot
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
            console.print(
                f"  {who}start: {boot.compile_cache} ({said.get(boot.compile_cache, '')}){init}"
            )
        elif enforce_eager:
            console.print(
                f"  {who}start: eager (enforce_eager: no model graph compiled; vLLM's own "
                "helpers compile at the first request, kept in the cache root)"
            )
        if boot.kv_cache_tokens:
            console.print(
                f"  {who}KV cache: {boot.kv_cache_tokens:,} tokens, "
                f"{boot.available_kv_cache_gib} GiB available, max concurrency "
                f"{boot.max_concurrency}x at {boot.max_concurrency_tokens_per_request:,} "
                "tokens per request"
            )
        console.print(f"  {who}{first_answer(ready)}")


def _smoke(state: DeploymentState) -> None:
    """``tandem eval smoke`` on each group of the deployment just started, at its own leader.

    Raises:
        CheckFailed: a check failed (the deployment stays up).
    """
    failed: list[str] = []
    run = smoke_checks.SmokeRun(reference=last_reference(state.name))
    for group in state.groups:
        folder = state.directory.path / "smoke"
        if len(state.groups) > 1:
            folder = folder / f"g{group.group}"
        out = ownership.output_folder(folder, force=True)
        who = f"group {group.group} " if len(state.groups) > 1 else ""

        def said(result: smoke_checks.CheckResult, who: str = who) -> None:
            console.print(
                f"  {who}smoke {result.check:<12} {result.outcome.value:<15} {result.summary}"
            )

        report = smoke_checks.run_smoke(
            smoke_checks.target_of(group),
            out,
            run,
            api_key=os.environ.get(wire.VLLM_API_KEY),  # the key the ranks were started with
            on_result=said,
        )
        failed += [
            f"{who}{c.check} ({out / smoke_checks.REPORT_MD})"
            for c in report.checks
            if c.outcome is smoke_checks.Outcome.FAIL
        ]
    if failed:
        raise CheckFailed(
            f"'{state.name}' is up, but its smoke check failed: {', '.join(failed)}",
            hint=f"read the report named; `tandem down {state.name}` stops it",
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
@deployment_argument
@click.option(
    "--all",
    "list_all",
    is_flag=True,
    help="List every deployment, one line each, even when there is only one (with --json "
    "always an array, [] when there is none).",
)
@json_option
@click.option(
    "--canary-timeout",
    "canary_timeout_s",
    type=FloatIn(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds a 1-token canary completion may "
    "take on an idle server before the engine counts as stalled.",
)
@click.option(
    "--nodes",
    is_flag=True,
    help="Read each node's memory, GPUs and RDMA ports in the same look (into each "
    "group's overview; what `tandem dashboard` shows).",
)
def status_command(
    name: str | None, list_all: bool, as_json: bool, canary_timeout_s: float, nodes: bool
) -> None:
    """List the deployments, or show one's verdict, endpoint and each rank's health.

    Without NAME: the only deployment's status when there is exactly one, else every
    deployment, one line each (name, backend, endpoint, model, verdict, revision), exit 0.
    The verdict comes from the health model (every process of every rank alive and running,
    the leader's /health, forward progress or a 1-token canary, error lines in the rank logs)
    and names the rank and the evidence.

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
      tandem status --all --json
      tandem status smollm2-local --json
      tandem status smollm2-local --json --nodes
    """
    names = list_deployments() if name is None else [name]
    if list_all or len(names) != 1:
        lines = every_deployment(canary_timeout_s=canary_timeout_s)
        if as_json:
            screen.echo(json.dumps([line.model_dump(mode="json") for line in lines], indent=2))
        else:
            _print_lines(lines)
        return
    status = lifecycle.status(names[0], canary_timeout_s=canary_timeout_s, nodes=nodes)
    if as_json:
        screen.echo(status.model_dump_json(indent=2))
    else:
        _print_status(status)
    if status.verdict.exit_code:
        raise click.exceptions.Exit(status.verdict.exit_code)


def _print_lines(lines: list[DeploymentLine]) -> None:
    if not lines:
        console.print("no deployment: `tandem up RECIPE` starts one (`tandem recipes` lists them)")
        return
    table = Table("name", "backend", "endpoint", "model", "verdict", "revision")
    for line in lines:
        verdict = _coloured(line.verdict) if line.verdict else f"[red]unknown[/red] {line.error}"
        groups = f" ({line.groups} groups)" if line.groups > 1 else ""
        table.add_row(
            line.name + groups,
            line.backend or "",
            f"{line.endpoint}/v1" if line.endpoint else "",
            line.model or "",
            verdict,
            str(line.revision) if line.revision is not None else "",
        )
    show(table, console)
    _print_ledger(every_ledger())
    if door := front_door_line():
        console.print(door)


def _print_ledger(ledgers: list[HostLedger]) -> None:
    """Each host's memory and what every deployment's plan holds there."""
    if not ledgers:
        return
    table = Table("host", "memory", "held by plan", "left", title="memory by plan, per host")
    for ledger in ledgers:
        held = ", ".join(
            f"{h.deployment} ({h.node}) "
            + (f"{h.budget_bytes / GIB:.2f} GiB" if h.known else "unknown")
            for h in ledger.holds
        )
        if ledger.outside_bytes:
            held += f", outside vLLM {ledger.outside_bytes / GIB:.2f} GiB"
        colour = "red" if ledger.left_bytes < 0 else "green"
        table.add_row(
            ledger.host,
            f"{ledger.total_bytes / GIB:.2f} GiB",
            held,
            f"[{colour}]{ledger.left_bytes / GIB:.2f} GiB[/{colour}]",
        )
    show(table, console)


def _print_status(status: lifecycle.DeploymentStatus) -> None:
    if status.upgrade_interrupted:
        console.print(f"[yellow]{status.upgrade_interrupted}[/yellow]")
    revision = f" revision {status.revision}" if status.revision is not None else ""
    console.print(
        f"[bold]{status.name}[/bold]{revision} ({status.backend}) {status.endpoint}/v1 "
        f"model '{status.model}': {_coloured(status.verdict)}"
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
    else:
        _print_ranks(status)
    if any(len({h.deployment for h in lg.holds}) > 1 for lg in status.ledger):
        _print_ledger(status.ledger)


def _print_ranks(status: lifecycle.DeploymentStatus) -> None:
    """A deployment without a router: its ranks, its groups' verdicts, planned vs logged."""
    table = Table("rank", "role", "node", "address", "processes", "health")
    for r in status.ranks:
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
            _coloured(r.health.state) + (f" {r.health.reason}" if r.health.reason else ""),
        )
    show(table, console)
    for g in status.groups if len(status.groups) > 1 else []:  # a LeaderWorkerSet's replicas
        console.print(
            f"  group {g.group} ({g.name}, ranks {', '.join(str(r.rank) for r in g.ranks)}): "
            + _coloured(g.verdict)
            + (f" — {g.reason}" if g.reason else "")
        )
    if status.planned and (compared := status.planned.comparison):
        for c in (compared.kv_pool_tokens, compared.kv_pool_gib, compared.max_concurrency):
            console.print(
                f"  planned vs actual {c.name}: {_figure(c.planned)} vs {_figure(c.measured)} "
                f"({c.error_pct:+.2f}%)"
                if c.error_pct is not None
                else f"  planned {c.name}: {c.planned}"
            )
    elif status.planned and status.planned.unavailable:
        console.print(f"  [dim]planned vs actual: {status.planned.unavailable}[/dim]")


def _coloured(word: Verdict | RankCondition) -> str:
    """A health word as markup, in the colour its enum gives it."""
    return f"[{word.colour}]{word.value}[/{word.colour}]"


def _figure(value: float | None) -> str:
    """A figure as a person reads it: a whole count without ``.0`` (93,184, not 93,184.0)."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def _print_groups(status: lifecycle.DeploymentStatus) -> None:
    """The router and its members, then each group's verdict and ranks."""
    router = status.router
    assert router is not None
    console.print(
        f"  router vllm-router {router.version} ({router.policy}) pid {router.pid}: "
        + ("running" if router.running else "[bold red]not running[/bold red]")
        + f", {len(router.members)} member(s)"
    )
    table = Table("group", "processes", "leader", "revision", "in rotation", "verdict", "ranks")
    for g in status.groups:
        table.add_row(
            str(g.group),
            g.name,
            g.endpoint,
            str(g.revision) if g.revision is not None else "-",
            "yes" if g.member else "no",
            _coloured(g.verdict) + (f" {g.reason}" if g.reason else ""),
            ", ".join(f"{r.rank} {r.health.state}" for r in g.ranks) or "none",
        )
    show(table, console)


@click.command("logs")
@deployment_argument
@click.option(
    "--group",
    type=click.IntRange(min=0),
    help="Only this group (a deployment with replicas). Default: all, prefixed by group.",
)
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
    name: str | None,
    group: int | None,
    rank: int | None,
    follow: bool,
    tail: int | None,
    bundle_path: Path | None,
) -> None:
    """Show the ranks' logs, each line prefixed with its rank.

    \b
    Examples:
      tandem logs --rank 1 --tail 50
      tandem logs tiny-local -f
      tandem logs tiny-local --bundle /tmp
      tandem logs smollm2-replicas --group 1 --tail 20
    """
    if bundle_path is not None:
        console.print(f"wrote {write_bundle(name, bundle_path)}")
        return
    redactor = Redactor.for_caller()
    several = len(load_state(name).groups) > 1
    for g, number, line in lifecycle.log_lines(
        name, group=group, rank=rank, follow=follow, tail=tail
    ):
        who = f"[group {g} rank {number}]" if several else f"[rank {number}]"
        screen.echo(f"{who} {redactor.text(line)}")


@click.command("down")
@deployment_argument
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
    node, so the next `tandem up` starts warm. Nothing to stop is no error (exit 0), so a
    script may call it twice.

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
    known = list_deployments()
    try:
        state = lifecycle.down(name, purge_caches=purge_caches, on_event=show_event)
    except StateError:
        if (name is None and known) or name in known:
            raise  # a deployment there is, whose state cannot be read or is ambiguous
        console.print(
            "nothing to stop: "
            + (f"no deployment named '{name}' runs" if name else "no deployment runs")
            + (f" (running: {', '.join(known)})" if known else "")
        )
        return
    if state is None:
        console.print("no deployment was running; removed what killed commands left")
        return
    more = ": the router and every group" if state.router is not None else ""
    console.print(f"[bold]{state.name}[/bold] is down{more}")


@click.command("chat")
@click.argument("words", nargs=-1, required=True, metavar="[NAME] MESSAGE")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Longest answer, in tokens.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the server's answer as JSON.")
@api_key_option
def chat_command(
    words: tuple[str, ...], max_tokens: int, as_json: bool, api_key: str | None
) -> None:
    """Send one chat message to a deployment and print the answer and token counts.

    NAME defaults to the only deployment there is; a deployment with replicas answers
    through its router.

    \b
    Examples:
      tandem chat "What is tensor parallelism?"
      tandem chat smollm2-local "What is the capital of Germany?" --max-tokens 16
    """
    if len(words) > 2:
        raise click.UsageError(
            f"{len(words)} words: give NAME and MESSAGE, and quote the message "
            '(tandem chat NAME "What is ...?")'
        )
    name, message = (None, words[0]) if len(words) == 1 else words
    state = load_state(name)  # a deployment with replicas: its router
    endpoint, model = state.endpoint, state.model
    messages = [{"role": "user", "content": message}]
    with Endpoint(endpoint, api_key=api_key) as server:
        data = server.chat(model, messages, timeout_s=300, max_tokens=max_tokens, temperature=0)
    if as_json:
        screen.echo(Redactor.for_caller().text(json.dumps(data, indent=2)))
        return
    usage = data.get("usage", {})
    console.print(f"[bold]{model}[/bold]: {data['choices'][0]['message'].get('content')!r}")
    console.print(
        f"  [dim]{usage.get('prompt_tokens')} prompt + {usage.get('completion_tokens')}"
        f" completion tokens, finish_reason {data['choices'][0].get('finish_reason')}"
        "[/dim]"
    )
