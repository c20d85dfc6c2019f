"""``tandem service install|status|uninstall``: a deployment as a systemd service."""

from __future__ import annotations

import os
from pathlib import Path

import click

from tandem import screen
from tandem.backends import systemd
from tandem.cli.layout import WholeSummaryGroup
from tandem.cli.options import (
    cluster_option,
    json_option,
    machine_deployment,
    recipe_argument,
    startup_timeout_option,
)
from tandem.errors import SpecError
from tandem.operations import lifecycle
from tandem.render.systemd import SECRET_VARS, UNIT_DIR

console = screen.console(highlight=False, soft_wrap=True)
unit_dir_option = click.option(
    "--unit-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=UNIT_DIR,
    show_default=True,
    help="Where the unit file goes.",
)


@click.group("service", cls=WholeSummaryGroup)
def service_command() -> None:
    """Run a deployment as a systemd service that comes back after a reboot.

    The unit runs `tandem up RECIPE --cluster FILE --supervise`: preflight, launch, readiness,
    then gang restarts when a rank dies; systemd starts it at boot after the network is online
    and again when the supervisor gives up. Secrets (VLLM_API_KEY, HF_TOKEN) go to a root-only
    EnvironmentFile the unit names, never into the unit.

    \b
    Examples:
      tandem service install deepseek-v4-flash --cluster examples/dgx-spark-pair.yaml
      tandem service status deepseek-v4-flash
      tandem service uninstall deepseek-v4-flash
    """


@service_command.command("install")
@recipe_argument
@cluster_option
@unit_dir_option
@click.option("--no-enable", is_flag=True, help="Only write the unit; do not enable it.")
@click.option("--start", is_flag=True, help="Also start it now (`systemctl enable --now`).")
@startup_timeout_option
def install_command(
    recipe: str,
    cluster_path: str | None,
    unit_dir: Path,
    no_enable: bool,
    start: bool,
    timeout_s: float | None,
) -> None:
    """Write the deployment's systemd unit and enable it.

    It starts at the next boot, or now with --start.
    VLLM_API_KEY and HF_TOKEN, when set in this shell, are written to
    /etc/tandem/NAME.env (mode 0600), which the unit reads.

    \b
    Examples:
      tandem service install tiny-local --start
      VLLM_API_KEY=... tandem service install deepseek-v4-flash --cluster pair.yaml
      tandem service install tiny-local --no-enable --unit-dir ./units
    """
    if no_enable and start:
        raise SpecError(
            "contradicts --no-enable: it enables the unit as it starts it "
            "(`systemctl enable --now`)",
            field="--start",
            hint="drop --no-enable to enable and start it now, or drop --start to only write "
            "the unit",
        )
    deployment = machine_deployment(recipe, cluster_path)
    # the unit runs `tandem up --supervise`: refuse here what that refuses
    lifecycle.check_launchable(deployment, supervise=True, ports=False)
    spec = systemd.spec_for(
        deployment.name, recipe, cluster_path, ["--timeout", f"{timeout_s:g}"] if timeout_s else []
    )
    secrets = {k: os.environ[k] for k in SECRET_VARS if os.environ.get(k)}
    unit, env_file = systemd.install(
        spec, unit_dir=unit_dir, enable=not no_enable, start=start, secrets=secrets
    )
    console.print(
        f"wrote {unit}" + (f" and {env_file} ({', '.join(sorted(secrets))})" if env_file else "")
    )
    if no_enable:
        console.print(f"  enable it with: systemctl enable --now {unit.name}")
    else:
        console.print(f"  enabled{' and started' if start else ''}: {unit.name}")


@service_command.command("status")
@click.argument("name")
@unit_dir_option
@json_option
def status_command(name: str, unit_dir: Path, as_json: bool) -> None:
    """Show whether the unit is installed, and its state under systemd.

    \b
    Examples:
      tandem service status tiny-local
      tandem service status tiny-local --json
    """
    result = systemd.status(name, unit_dir=unit_dir)
    if as_json:
        screen.echo(result.model_dump_json(indent=2))
        return
    console.print(
        f"[bold]{result.unit}[/bold]: "
        + (f"installed at {result.unit_path}" if result.installed else "not installed")
    )
    if not result.systemd:
        console.print(
            f"  systemd is not the init system here (PID 1 is '{systemd.init_process()}')"
        )
    for key, value in result.properties.items():
        console.print(f"  {key}: {value}")


@service_command.command("uninstall")
@click.argument("name")
@unit_dir_option
def uninstall_command(name: str, unit_dir: Path) -> None:
    """Stop and disable the unit (its ExecStop runs `tandem down`), then remove it.

    \b
    Examples:
      tandem service uninstall tiny-local
    """
    removed = systemd.uninstall(name, unit_dir=unit_dir)
    console.print("removed " + (", ".join(str(p) for p in removed) if removed else "nothing"))
