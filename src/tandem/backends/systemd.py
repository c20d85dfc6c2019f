"""``tandem service``: write, enable, inspect and remove a deployment's systemd unit.

The unit's text is ``tandem.render.systemd``; this module resolves what it needs from the
installing shell (this Python, ``TANDEM_HOME``, absolute recipe and cluster paths), writes the
unit and the root-only secrets file, and drives ``systemctl``. systemd must be the init system
(``/run/systemd/system`` exists, as ``sd_booted(3)`` checks) to enable or start a unit; without
it only ``--no-enable`` (write the unit) works, and every other step says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from tandem import ownership
from tandem.backends.state import state_root
from tandem.errors import BackendError
from tandem.files import open_private
from tandem.render.systemd import (
    PASSED_VARS,
    SECRET_VARS,
    UNIT_DIR,
    ServiceSpec,
    env_file,
    render_env_file,
    render_unit,
    unit_name,
)
from tandem.spec.loading import builtin_recipe_names

SYSTEMD_RUNTIME_DIR = Path("/run/systemd/system")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHOWN_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "NRestarts",
    "ExecMainPID",
    "ExecMainStartTimestamp",
)


class ServiceStatus(BaseModel):
    """What ``tandem service status`` reports."""

    unit: str
    unit_path: str
    installed: bool = Field(description="The unit file exists.")
    systemd: bool = Field(description="systemd is this machine's init system.")
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="`systemctl show` values: ActiveState, SubState, NRestarts, ...",
    )


def systemd_running() -> bool:
    """True when systemd is the init system (what ``sd_booted`` tests)."""
    return SYSTEMD_RUNTIME_DIR.is_dir()


def init_process() -> str:
    """The name of PID 1, for messages (``systemd``, ``init``, a container's entry point)."""
    try:
        return Path("/proc/1/comm").read_text().strip()
    except OSError:
        return "unknown"


def tandem_program() -> Path:
    """The ``tandem`` script of this Python's environment (the one running now).

    Raises:
        BackendError: it has none (tandem imported from a source tree without installing).
    """
    beside = Path(sys.executable).parent / "tandem"
    found = beside if beside.exists() else Path(shutil.which("tandem") or "")
    if not found.name:
        raise BackendError(
            "no `tandem` program beside this Python or on PATH for the unit to run",
            hint="install tandem into this environment (`pip install -e .`)",
        )
    return found.absolute()


def spec_for(
    deployment: str, recipe: str, cluster_path: str | None, up_args: list[str] | None = None
) -> ServiceSpec:
    """The unit of a deployment as this shell would run it: this environment's tandem, its
    state folder, and the recipe and cluster by absolute path (a built-in recipe by name)."""
    program = tandem_program()
    environment = {
        "TANDEM_HOME": str(state_root().resolve()),
        "PATH": f"{program.parent}:{DEFAULT_PATH}",
    }
    environment |= {k: os.environ[k] for k in PASSED_VARS if os.environ.get(k)}
    return ServiceSpec(
        deployment=deployment,
        tandem=[str(program)],
        recipe=recipe if recipe in builtin_recipe_names() else str(Path(recipe).resolve()),
        cluster=str(Path(cluster_path).resolve()) if cluster_path else None,
        environment=environment,
        supervise_args=list(up_args or []),
    )


def _systemctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"systemctl {' '.join(args)} did not run: {exc}") from exc
    if check and result.returncode:
        raise BackendError(
            f"systemctl {' '.join(args)} failed: {(result.stderr or result.stdout).strip()}"
        )
    return result


def _require_systemd(action: str) -> None:
    if not systemd_running():
        raise BackendError(
            f"cannot {action}: systemd is not the init system here (PID 1 is '{init_process()}')",
            hint="on a systemd host run it again; here "
            "`tandem service install --no-enable` only writes the unit",
        )


def install(
    spec: ServiceSpec,
    *,
    unit_dir: Path = Path(UNIT_DIR),
    enable: bool = True,
    start: bool = False,
    secrets: dict[str, str] | None = None,
    env_path: Path | None = None,
) -> tuple[Path, Path | None]:
    """Write the secrets file (when secrets are given) and the unit, then enable it.

    Every file is checked writable before any is written, so a refusal leaves nothing behind;
    the secrets file is written first, so the unit never names one that is not there (its
    ``EnvironmentFile=-`` would start the API without its key).

    Returns:
        The unit's path and the secrets file's path (None when none was written).

    Raises:
        BackendError: systemd is not running and ``enable`` or ``start`` was asked, a file
            cannot be written (nothing was), or systemctl refused.
    """
    if enable or start:
        _require_systemd("enable the service")
    unit_path = unit_dir / unit_name(spec.deployment)
    secrets = {k: v for k, v in (secrets or {}).items() if k in SECRET_VARS and v}
    written = (env_path or Path(env_file(spec.deployment))) if secrets else None
    unit_text = render_unit(spec)
    _check_writable(unit_path, hint="run it as root (sudo), or give --unit-dir a folder you own")
    if written:
        _check_writable(
            written,
            hint=f"run it as root (sudo): the secrets file goes to {written.parent}, "
            "readable by root only",
        )
    try:
        if written:
            written.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open_private(written, "w") as handle:
                handle.write(render_env_file(secrets))
        unit_dir.mkdir(parents=True, exist_ok=True)
        unit_path.write_text(unit_text)
    except OSError as exc:
        raise BackendError(
            f"cannot be written: {exc.strerror or exc}",
            file=str(exc.filename or unit_path),
            hint="run it as root (sudo), or give --unit-dir a folder you own",
        ) from exc
    if enable or start:
        _systemctl("daemon-reload")
        _systemctl("enable", *(["--now"] if start else []), unit_path.name)
    return unit_path, written


def _check_writable(path: Path, *, hint: str) -> None:
    """Refuse ``path`` when this user cannot create or replace it: its nearest existing
    folder is a file or not writable, or the path itself is a folder or read-only.

    Raises:
        BackendError: it cannot be written; nothing was.
    """
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    problem = None
    if path.is_dir():
        problem = "it is a folder"
    elif not existing.is_dir():
        problem = f"{existing} is a file, not a folder"
    elif path.exists() and not os.access(path, os.W_OK):
        problem = "it is not writable by this user"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{existing} is not writable by this user"
    if problem:
        raise BackendError(
            f"cannot be written: {problem}; nothing was written", file=str(path), hint=hint
        )


def status(deployment: str, *, unit_dir: Path = Path(UNIT_DIR)) -> ServiceStatus:
    """The unit's file and, under systemd, its state as ``systemctl show`` reports it."""
    unit = unit_name(deployment)
    path = unit_dir / unit
    result = ServiceStatus(
        unit=unit, unit_path=str(path), installed=path.is_file(), systemd=systemd_running()
    )
    if result.systemd:
        shown = _systemctl(
            "show", unit, "--property=" + ",".join(SHOWN_PROPERTIES), check=False
        ).stdout
        result.properties = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    return result


def uninstall(
    deployment: str, *, unit_dir: Path = Path(UNIT_DIR), env_path: Path | None = None
) -> list[Path]:
    """Stop and disable the unit (under systemd), then remove it and its secrets file.

    Stopping runs the unit's ``ExecStop`` (``tandem down``), so no rank outlives the service.
    Returns the files removed.
    """
    unit = unit_name(deployment)
    if systemd_running():
        _systemctl("disable", "--now", unit, check=False)
    secrets_file = env_path or Path(env_file(deployment))
    removed = [
        path
        for path, root in ((unit_dir / unit, unit_dir), (secrets_file, secrets_file.parent))
        if ownership.remove_file(path, root=root)  # a link out of its folder is refused
    ]
    if systemd_running():
        _systemctl("daemon-reload", check=False)
    return removed
