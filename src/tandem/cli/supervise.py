"""``tandem supervise``: gang restarts on bare hosts (LWS's RecreateGroupOnPodRestart)."""

from __future__ import annotations

import signal
import subprocess
import sys

import click
from rich.console import Console

from tandem import ownership
from tandem.backends.state import FleetState, fleet_exists, load_fleet, load_state
from tandem.cli.options import NOT_NEGATIVE, POSITIVE
from tandem.interrupts import Interrupted, raise_on_termination
from tandem.supervisor import BACKOFF_RESET_S, SupervisorPolicy, supervise

console = Console(highlight=False)


def run_supervisor(name: str, policy: SupervisorPolicy = SupervisorPolicy()) -> None:
    """Supervise in the foreground until the deployment is taken down (exit 0) or given up (1).

    SIGTERM is how ``tandem down`` stops it: it raises ``Interrupted`` like any stop, so a
    restart in progress says it was interrupted (not that its start-up failed) and cleans up,
    the supervisor writes why it stopped, and the exit status is 0.
    """
    raise_on_termination()
    try:
        code = supervise(
            name,
            policy,
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
@click.option(
    "--interval",
    "interval_s",
    type=POSITIVE,
    default=5.0,
    show_default=True,
    help="Seconds between two looks at the ranks and the leader's /health.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Group restarts in a row before giving up and stopping every rank.",
)
@click.option(
    "--backoff",
    "backoff_s",
    type=NOT_NEGATIVE,
    default=10.0,
    show_default=True,
    help="Seconds before the first restart; each further one waits twice as long, until "
    f"the group stays healthy for {BACKOFF_RESET_S:g} s.",
)
@click.option(
    "--health-failures",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Failed /health requests in a row that count as the leader not answering.",
)
@click.option(
    "--canary-interval",
    "canary_interval_s",
    type=NOT_NEGATIVE,
    default=30.0,
    show_default=True,
    help="Seconds between 1-token canary completions on an idle "
    "server (0: none; under load the token counters show progress instead).",
)
@click.option(
    "--stall",
    "stall_s",
    type=POSITIVE,
    default=30.0,
    show_default=True,
    help="Seconds with requests running and no token counted that mean stalled.",
)
@click.option(
    "--router-membership/--no-router-membership",
    "membership",
    default=True,
    show_default=True,
    help="With replicas: take a broken group out of the router before its restart and put "
    "it back after its canary (off: the router's own /health poll decides alone).",
)
def supervise_command(
    name: str | None,
    interval_s: float,
    max_restarts: int,
    backoff_s: float,
    health_failures: int,
    canary_interval_s: float,
    stall_s: float,
    membership: bool,
) -> None:
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
      tandem supervise tiny-ssh
      tandem supervise smollm2-replicas
      nohup tandem supervise tiny-ssh --max-restarts 5 --backoff 30 &
    """
    if name is not None and fleet_exists(ownership.check_name(name)):
        options = [
            f"--interval={interval_s}",
            f"--max-restarts={max_restarts}",
            f"--backoff={backoff_s}",
            f"--health-failures={health_failures}",
            f"--canary-interval={canary_interval_s}",
            f"--stall={stall_s}",
            "--router-membership" if membership else "--no-router-membership",
        ]
        sys.exit(supervise_groups(load_fleet(name), options))
    name = load_state(name).name  # an unknown name is an error here, before any file is written
    run_supervisor(
        name,
        SupervisorPolicy(
            interval_s=interval_s,
            max_restarts=max_restarts,
            backoff_s=backoff_s,
            health_failures=health_failures,
            canary_interval_s=canary_interval_s,
            stall_s=stall_s,
            membership=membership,
        ),
    )


def supervise_groups(fleet: FleetState, options: list[str]) -> int:
    """Supervise each group of a fleet in a process of its own (``tandem supervise NAME-gG``),
    so a group's restart never holds up another group's look; each takes its group out of the
    router before it restarts it and back in after its canary (``tandem.supervisor``). SIGTERM
    or Ctrl-C is passed on to every one; the worst exit status is returned."""
    console.print(f"supervising the {len(fleet.groups)} groups of '{fleet.name}'")
    children = [
        subprocess.Popen([sys.executable, "-m", "tandem.cli", "supervise", group, *options])
        for group in fleet.groups
    ]

    def forward(signum: int, frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(child.wait() for child in children)
