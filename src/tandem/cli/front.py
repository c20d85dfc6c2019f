"""``tandem front``: one endpoint for every deployment on this machine, routed by model name."""

from __future__ import annotations

import click
from rich.table import Table

from tandem import screen
from tandem.cli.layout import HELP_OPTIONS, WholeSummaryGroup
from tandem.cli.options import PORT, FloatIn, json_option
from tandem.operations import front
from tandem.report.terminal import show

console = screen.console(highlight=False, soft_wrap=True)


@click.group("front", cls=WholeSummaryGroup, context_settings=HELP_OPTIONS)
def front_command() -> None:
    """One endpoint for every model: a request goes to the deployment serving its `model`.

    The front door lists exactly the models that answer: it looks at every deployment of this
    state root (TANDEM_HOME) as `tandem status` does, each --interval seconds, and a model
    whose deployment is down, stalled or still starting leaves /v1/models and gets the 404
    of a model not served until it serves again. `up` and `down` of a deployment never touch
    it. Started with VLLM_API_KEY set, it asks the same key for /v1/models; requests carry
    the client's key to the deployment.

    \b
    Examples:
      tandem front start                   # http://127.0.0.1:8300/v1
      tandem front status
      tandem front stop
    """


@front_command.command("start")
@click.option("--host", default=front.LOOPBACK, show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=PORT,
    default=front.DEFAULT_PORT,
    show_default=True,
    help="Port of its OpenAI API.",
)
@click.option(
    "--interval",
    "interval_s",
    type=FloatIn(min=0.2),
    default=1.0,
    show_default=True,
    help="Seconds between two looks at every deployment: how long a model that stopped "
    "answering stays listed, at most (plus one look).",
)
def start_command(host: str, port: int, interval_s: float) -> None:
    """Start the front door in the background and wait until it answers.

    \b
    Examples:
      tandem front start
      tandem front start --port 9000 --interval 2
    """
    door = front.start(
        host=host,
        port=port,
        interval_s=interval_s,
        on_event=lambda text: console.print(f"  [dim]{text}[/dim]"),
    )
    console.print(f"[green]front door[/green] at {door.url}/v1 (log {door.log})")


@front_command.command("stop")
def stop_command() -> None:
    """Stop the front door this state root started (its deployments keep serving).

    \b
    Examples:
      tandem front stop
      TANDEM_HOME=/srv/tandem tandem front stop
    """
    door = front.stop()
    console.print(f"stopped the front door (pid {door.pid})" if door else "no front door")


@front_command.command("status")
@json_option
def status_command(as_json: bool) -> None:
    """The front door, the models it lists, and every deployment judged now.

    \b
    Examples:
      tandem front status
      tandem front status --json
    """
    found = front.status()
    if as_json:
        screen.echo_json(found.model_dump(mode="json"))
        return
    if found.url is None:
        console.print("no front door: `tandem front start` starts one")
    else:
        state = "running" if found.running else "[bold red]not running[/bold red]"
        console.print(
            f"front door {found.url}/v1 (pid {found.pid}): {state}, lists "
            f"{', '.join(found.listed) or 'no model'}"
        )
    table = Table("model", "deployment", "endpoint", "verdict", "routed")
    for member in found.members:
        verdict = member.verdict.value if member.verdict else f"unknown: {member.reason}"
        table.add_row(
            member.model,
            member.deployment,
            member.endpoint,
            verdict,
            "yes" if member.serving else "no",
        )
    show(table, console)
