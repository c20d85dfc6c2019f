"""``tandem supervise``: gang restarts on bare hosts (LWS's RecreateGroupOnPodRestart)."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import click

from tandem import screen
from tandem.backends.state import load_state
from tandem.cli.options import as_options, field_option
from tandem.interrupts import Interrupted, raise_on_termination
from tandem.operations.supervisor import SupervisorPolicy, supervise

console = screen.console(highlight=False)


def run_supervisor(
    name: str,
    policy: SupervisorPolicy = SupervisorPolicy(),
    options: list[str] | None = None,
    *,
    group: int | None = None,
) -> None:
    """Supervise in the foreground until the deployment is taken down (exit 0) or given up (1).

    A deployment of several groups gets a supervisor process for each group
    (``supervise_groups``, each running this with its ``group``). SIGTERM is how ``tandem
    down`` stops it: it raises ``Interrupted`` like any stop, so a restart in progress says it
    was interrupted (not that its start-up failed) and cleans up, the supervisor writes why it
    stopped, and the exit status is 0.
    """
    groups = [g.group for g in load_state(name).groups]
    if group is None and len(groups) > 1:
        sys.exit(supervise_groups(name, groups, options or []))
    raise_on_termination()
    try:
        code = supervise(
            name,
            policy,
            group=groups[0] if group is None and groups else group or 0,
            on_event=lambda text: console.print(f"  [dim]{text}[/dim]", soft_wrap=True),
        )
    except Interrupted as exc:
        if exc.signum != signal.SIGTERM:
            raise
        code = 0
    if code:
        sys.exit(code)


@click.command("supervise")
@click.argument("name", required=False)
@field_option(SupervisorPolicy, "interval_s", flag="--interval")
@field_option(SupervisorPolicy, "max_restarts")
@field_option(SupervisorPolicy, "backoff_s", flag="--backoff")
@field_option(SupervisorPolicy, "health_failures")
@field_option(SupervisorPolicy, "canary_interval_s", flag="--canary-interval")
@field_option(SupervisorPolicy, "stall_s", flag="--stall")
@field_option(SupervisorPolicy, "membership", flag="--router-membership")
@click.option(
    "--group",
    type=click.IntRange(min=0),
    default=None,
    hidden=True,
    help="Supervise only this group (what `tandem supervise NAME` runs for each group).",
)
def supervise_command(name: str | None, **fields: Any) -> None:
    """Watch a deployment and restart the whole group when any rank faults.

    A fault is what `tandem status` calls degraded, stalled or down: a process of any rank
    gone or stopped (checked over ssh for remote nodes; a dead headless worker leaves the
    leader's /health at 200, so health alone would not notice), the leader not answering, no
    forward progress, or a fatal error in a rank's log. A restart stops every rank, keeps the
    crashed group's logs in logs/restart-N/, starts the workers and the leader again, in order,
    and waits for a real completion. Every event (verdict, rank, evidence, time to answer
    again) goes to the deployment's events.log (included in `tandem logs --bundle`). Runs until
    `tandem down`.

    With replicas, each group is supervised by a process of its own: a broken group leaves
    the router's rotation at once, before its back-off and restart, and joins it again only
    after its restart answered a real completion at its own leader.

    \b
    Examples:
      tandem supervise tiny-local
      tandem supervise smollm2-replicas
      nohup tandem supervise tiny-local --max-restarts 5 --backoff 30 &
    """
    group = fields.pop("group")
    policy = SupervisorPolicy(**fields)
    name = load_state(name).name  # an unknown name is an error here, before any file is written
    run_supervisor(name, policy, as_options(policy, list(fields)), group=group)


def supervise_groups(name: str, groups: list[int], options: list[str]) -> int:
    """Supervise each group in a process of its own (``tandem supervise NAME --group G``), so a
    group's restart never holds up another group's look; each takes its group out of the
    router before it restarts it and back in after its canary (``tandem.operations.supervisor``).
    SIGTERM or Ctrl-C is passed on to every one; the worst exit status is returned."""
    console.print(f"supervising the {len(groups)} groups of '{name}'")
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "supervise", name, "--group", str(g), *options]
        )
        for g in groups
    ]

    def forward(signum: int, frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(child.wait() for child in children)
