"""``tandem upgrade``, ``tandem rollback``, ``tandem history``: a deployment's revisions."""

from __future__ import annotations

import click
from pydantic import ValidationError

from tandem import ownership, screen
from tandem.backends.state import fleet_exists
from tandem.cli.lifecycle import console, show_event, show_phase
from tandem.cli.options import (
    cluster_option,
    field_option,
    given,
    machine_deployment,
    option_of,
    startup_timeout_option,
)
from tandem.errors import SpecError
from tandem.jsonfiles import validation_text
from tandem.operations import revisions
from tandem.redact import Redactor
from tandem.spec.deployment import Deployment
from tandem.upgrade import GateLimits, rollback, rolling_upgrade, upgrade


@click.command("upgrade")
@click.argument("name")
@click.option("--recipe", "recipe", required=True, help="The new recipe (a built-in name or YAML).")
@cluster_option
@startup_timeout_option
@field_option(GateLimits, "max_tpot_increase")
@field_option(GateLimits, "max_throughput_drop")
@field_option(GateLimits, "bench")
def upgrade_command(
    name: str,
    recipe: str,
    cluster_path: str | None,
    timeout_s: float | None,
    **limits: object,
) -> None:
    """Move the running deployment NAME to a new recipe, behind a gate; roll back on failure.

    The new recipe is planned first (nothing stops if it does not fit). Then the current
    revision stops (its compile caches kept), the new one starts, and the gate runs: `tandem
    eval smoke` (all but the needle, up to the first failure) and a short bench against the
    old revision's figures. A failed start or gate stops the new revision and starts the old
    one again, warm; the failed check and its evidence are printed and kept in `tandem
    history`. Exit 1 on a rollback.

    \b
    With replicas the upgrade rolls: one group at a time leaves the router, drains, is
    upgraded behind the gate and joins again while the others serve; the first group is the
    canary, and the first group that fails is rolled back and stops the roll.

    \b
    Examples:
      tandem upgrade tiny-local --recipe new-tiny.yaml
      tandem upgrade smollm2-replicas --recipe new-replicas.yaml
      tandem upgrade deepseek-v4-flash --recipe dsv4-new.yaml --cluster pair.yaml --no-bench
    """
    gate_limits = _gate_limits(click.get_current_context(), limits)
    marker = revisions.interrupted_upgrade(name)
    if marker:
        show_event(
            f"an earlier upgrade from revision {marker.from_revision} was interrupted "
            f"({marker.phase}); starting from what runs now"
        )
    if fleet_exists(ownership.check_name(name)):
        _rolling(name, machine_deployment(recipe, cluster_path), timeout_s, gate_limits)
        return
    result = upgrade(
        name,
        machine_deployment(recipe, cluster_path),
        limits=gate_limits,
        timeout_s=timeout_s,
        on_event=show_event,
        on_phase=show_phase,
    )
    if result.outcome == "upgraded":
        console.print(
            f"[bold]{name}[/bold]: revision {result.to_revision} passed the gate and runs "
            f"(was {result.from_revision})"
        )
        return
    console.print(
        f"[bold]{name}[/bold]: revision {result.to_revision} [red]failed[/red] "
        f"({result.gate.check}); rolled back to revision {result.running_revision}"
    )
    for line in result.gate.evidence[:6]:
        console.print(f"  [dim]{line}[/dim]")
    raise click.exceptions.Exit(1)


def _gate_limits(ctx: click.Context, limits: dict) -> GateLimits:
    """The gate's limits as the command line gave them (a default is not given: ``--no-bench``
    with the default limits is no conflict).

    Raises:
        SpecError: a limit given with ``--no-bench``, named by its option.
    """
    chosen = given(ctx, limits)
    try:
        return GateLimits.model_validate(chosen)
    except ValidationError as exc:
        flags = [option_of(GateLimits, n) for n in sorted(chosen) if n != "bench"]
        if chosen.get("bench") is not False or not flags:
            raise SpecError(validation_text(exc), field="gate") from exc
        raise SpecError(
            f"{' and '.join(flags)} limit the gate bench, and --no-bench skips it",
            field="--no-bench",
            hint=f"drop {' and '.join(flags)}, or --no-bench",
        ) from exc


def _rolling(name: str, new: Deployment, timeout_s: float | None, limits: GateLimits) -> None:
    """``upgrade`` of a deployment with replicas: group by group, the first the canary."""
    results = rolling_upgrade(
        name,
        new,
        limits=limits,
        timeout_s=timeout_s,
        on_event=show_event,
        on_phase=show_phase,
    )
    for index, result in enumerate(results):
        verdict = (
            f"revision {result.to_revision} passed the gate"
            if result.outcome == "upgraded"
            else f"revision {result.to_revision} [red]failed[/red] ({result.gate.check}); "
            f"back on revision {result.running_revision}"
        )
        console.print(f"[bold]{result.name}[/bold] (group {index}): {verdict}")
    if any(r.outcome == "rolled-back" for r in results):
        raise click.exceptions.Exit(1)


@click.command("rollback")
@click.argument("name")
@click.option(
    "--to",
    "to",
    type=click.IntRange(min=1),
    help="Revision number. Default: the good one before the current.",
)
@startup_timeout_option
def rollback_command(name: str, to: int | None, timeout_s: float | None) -> None:
    """Stop what runs of NAME and start an earlier revision again (warm: caches are kept).

    \b
    Examples:
      tandem rollback tiny-local
      tandem rollback tiny-local --to 2
    """
    target = rollback(name, to, timeout_s=timeout_s, on_event=show_event, on_phase=show_phase)
    console.print(f"[bold]{name}[/bold]: revision {target.number} runs")


@click.command("history")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Every revision as JSON.")
def history_command(name: str, as_json: bool) -> None:
    """List the revisions of NAME, oldest first, each with what changed from the one before.

    \b
    Examples:
      tandem history tiny-local
    """
    known = [_redacted(r) for r in revisions.history(name)]
    if as_json:
        screen.echo_json([r.model_dump(mode="json") for r in known])
        return
    if not known:
        console.print(f"[bold]{name}[/bold] has no revision yet (every `tandem up` records one)")
        return
    previous: revisions.Revision | None = None
    for revision in known:
        reason = f": {screen.shown(revision.reason)}" if revision.reason else ""
        console.print(
            f"revision {revision.number}  {revision.created_at:%Y-%m-%d %H:%M:%S}  "
            f"{revision.outcome}{reason}",
            markup=False,
        )
        changed: list[str] = revisions.changes(previous, revision) if previous else []
        for change in changed:
            console.print(f"  {change}", markup=False)
        previous = revision


def _redacted(revision: revisions.Revision) -> revisions.Revision:
    """``revision`` as ``history`` shows it: the values of secret-named keys (a recipe's
    ``env``) hidden too, besides what every printed line hides (one restored from a backup
    may hold a token)."""
    data = Redactor.for_caller().data(revision.model_dump(mode="json"))
    return revisions.Revision.model_validate(data)
