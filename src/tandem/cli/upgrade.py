"""``tandem upgrade``, ``tandem rollback``, ``tandem history``: a deployment's revisions."""

from __future__ import annotations

import click
from pydantic import ValidationError

from tandem import screen
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
from tandem.upgrade import GateLimits, UpgradeOutcome, rollback, upgrade


@click.command("upgrade")
@click.argument("name")
@click.option("--recipe", "recipe", required=True, help="The new recipe (a built-in name or YAML).")
@cluster_option
@startup_timeout_option
@field_option(GateLimits, "max_tpot_increase")
@field_option(GateLimits, "max_throughput_drop")
@field_option(GateLimits, "rounds")
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
    revision's answers are recorded (once a revision) and its speed measured, then it stops
    (its compile caches kept), the new one starts, and the gate runs: `tandem eval smoke` (all
    but the needle, the answers judged against the old revision's, up to the first failure)
    and the same bench rounds, failed only when slower than the limits beyond the rounds'
    noise. A failed start or gate stops the new revision and starts the old one again, warm;
    the failed check and its evidence are printed and kept in `tandem history`. Exit 1 on a
    rollback.

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
    result = upgrade(
        name,
        machine_deployment(recipe, cluster_path),
        limits=gate_limits,
        timeout_s=timeout_s,
        on_event=show_event,
        on_phase=show_phase,
    )
    if result.outcome is UpgradeOutcome.UPGRADED:
        console.print(
            f"[bold]{name}[/bold]: revision {result.to_revision} passed the gate and runs "
            f"(was {result.from_revision})"
        )
        return
    where = f" in group {result.group}" if result.group else ""
    console.print(
        f"[bold]{name}[/bold]: revision {result.to_revision} [red]failed[/red]{where} "
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


@click.command("rollback")
@click.argument("name")
@click.option(
    "--to",
    "to",
    type=click.IntRange(min=1),
    help="Revision number. Default: the good one before the current.",
)
@click.option(
    "--group",
    type=click.IntRange(min=0),
    help="Only this group (a deployment with replicas). Default: every group, one at a time.",
)
@startup_timeout_option
def rollback_command(name: str, to: int | None, group: int | None, timeout_s: float | None) -> None:
    """Move NAME back to an earlier revision (warm: caches are kept).

    With replicas the groups go back one at a time through the router, as an upgrade rolls.

    \b
    Examples:
      tandem rollback tiny-local
      tandem rollback tiny-local --to 2
      tandem rollback smollm2-replicas --group 1
    """
    target = rollback(
        name, to, group=group, timeout_s=timeout_s, on_event=show_event, on_phase=show_phase
    )
    who = f" in group {group}" if group is not None else ""
    console.print(f"[bold]{name}[/bold]: revision {target.number} runs{who}")


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
    running = revisions.running_groups(name)
    previous: revisions.Revision | None = None
    for revision in known:
        reason = f": {screen.shown(revision.reason)}" if revision.reason else ""
        groups = running.get(revision.number, [])
        runs = f"  runs on group(s) {', '.join(map(str, groups))}" if groups else ""
        console.print(
            f"revision {revision.number}  {revision.created_at:%Y-%m-%d %H:%M:%S}  "
            f"{revision.outcome.value}{reason}{runs}",
            markup=False,
        )
        if revision.answers_checked:
            console.print(
                f"  answers checked {screen.shown(revision.answers_checked)}", markup=False
            )
        if revision.answers:
            console.print(f"  answers reference: {revision.answers}", markup=False)
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
