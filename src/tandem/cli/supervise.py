"""``tandem supervise``: gang restarts on bare hosts (LWS's RecreateGroupOnPodRestart)."""

from __future__ import annotations

import signal
import sys

import click
from rich.console import Console

from tandem.backends.state import load_state
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
def supervise_command(
    name: str | None,
    interval_s: float,
    max_restarts: int,
    backoff_s: float,
    health_failures: int,
    canary_interval_s: float,
    stall_s: float,
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

    \b
    Examples:
      tandem supervise tiny-ssh
      nohup tandem supervise tiny-ssh --max-restarts 5 --backoff 30 &
    """
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
        ),
    )
