"""A deployment as a systemd service: the supervisor that brings it up, and back after a reboot.

The unit runs ``tandem up RECIPE --cluster FILE --supervise`` in the foreground: the preflight,
the launch, the readiness wait, then gang supervision (``tandem.backends.supervisor``), so a
rank that dies restarts the group and a reboot brings the deployment back. Its parts:

- ``After=``/``Wants=network-online.target``: the ranks need the nodes' addresses;
- ``ExecStartPre=-tandem down NAME``: clears what the previous boot or run left (stale state, a
  rank still alive on an ssh node); the ``-`` accepts "nothing to stop";
- ``ExecStop=tandem down NAME``: a ``systemctl stop`` stops every rank on every node;
- ``Restart=on-failure``: when the supervisor gives up (exit 1) or up fails, systemd starts the
  whole thing again after ``RestartSec``; a deliberate ``tandem down`` ends the supervisor with
  0 and the service stays stopped;
- ``Environment=``: ``TANDEM_HOME`` and the few variables tandem reads, as they were at install;
- ``EnvironmentFile=-``: secrets (``VLLM_API_KEY``, ``HF_TOKEN``) come from a root-only file the
  unit names; no secret is ever written into the unit itself.

Pure: text only (``tandem.backends.systemd`` writes and enables it).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from tandem import ownership, wire

UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/tandem"
SECRET_VARS = (wire.VLLM_API_KEY, "HF_TOKEN")
"""Secrets the unit's EnvironmentFile may hold; never written into the unit."""
PASSED_VARS = (wire.HF_HOME, "TANDEM_SSH_CONFIG", "KUBECONFIG", "PYTHONPATH")
"""Variables carried from the installing shell into the unit when they are set there."""
RESTART_SEC = 30
STOP_TIMEOUT_S = 180
"""Long enough for ``tandem down``'s SIGTERM grace on every rank, then SIGKILL."""


def unit_name(deployment: str) -> str:
    """The service of a deployment, e.g. ``tandem-deepseek-v4-flash.service``.

    Raises:
        SpecError: ``deployment`` is not a deployment name (it becomes a file name).
    """
    return f"tandem-{ownership.check_name(deployment)}.service"


def env_file(deployment: str) -> str:
    """The root-only file of a deployment's secrets, e.g. ``/etc/tandem/tiny-local.env``.

    Raises:
        SpecError: ``deployment`` is not a deployment name (``../x`` would leave ``ENV_DIR``).
    """
    return f"{ENV_DIR}/{ownership.check_name(deployment)}.env"


@dataclass(frozen=True)
class ServiceSpec:
    """What the unit runs.

    Usage:
        ServiceSpec(deployment="tiny-local", tandem=["/opt/venv/bin/tandem"],
                    recipe="tiny-local", cluster=None,
                    environment={"TANDEM_HOME": "/var/lib/tandem"})
    """

    deployment: str
    tandem: list[str]
    """The tandem command line: an absolute program, e.g. ``["/opt/venv/bin/tandem"]``."""
    recipe: str
    """A built-in recipe name or an absolute recipe path."""
    cluster: str | None
    """An absolute cluster inventory path; None for this machine."""
    environment: dict[str, str] = field(default_factory=dict)
    """``TANDEM_HOME``, ``PATH`` and the ``PASSED_VARS`` that were set; never a secret."""
    supervise_args: list[str] = field(default_factory=list)
    """Extra options of ``tandem up``, e.g. ``["--timeout", "1800"]``."""


def _quote_env(key: str, value: str) -> str:
    """One ``Environment=`` assignment, quoted the way systemd parses it."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'Environment="{key}={escaped}"'


def _command(argv: list[str]) -> str:
    """An Exec line: shell-like quoting, which systemd accepts, and ``%`` escaped."""
    return " ".join(shlex.quote(a) for a in argv).replace("%", "%%")


def render_unit(spec: ServiceSpec) -> str:
    """The unit file's text.

    Raises:
        ValueError: a secret in ``spec.environment`` (it belongs in the EnvironmentFile).
    """
    secrets = sorted(set(spec.environment) & set(SECRET_VARS))
    if secrets:
        raise ValueError(f"{', '.join(secrets)} must come from the EnvironmentFile, not the unit")
    up = [*spec.tandem, "up", spec.recipe]
    if spec.cluster:
        up += ["--cluster", spec.cluster]
    up += [*spec.supervise_args, "--supervise"]
    down = [*spec.tandem, "down", spec.deployment]
    lines = [
        "# Written by `tandem service install`; remove with `tandem service uninstall "
        f"{spec.deployment}`.",
        "[Unit]",
        f"Description=tandem deployment {spec.deployment} (supervised)",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        *(_quote_env(k, v) for k, v in sorted(spec.environment.items())),
        f"EnvironmentFile=-{env_file(spec.deployment)}",
        f"ExecStartPre=-{_command(down)}",
        f"ExecStart={_command(up)}",
        f"ExecStop={_command(down)}",
        "Restart=on-failure",
        f"RestartSec={RESTART_SEC}",
        f"TimeoutStopSec={STOP_TIMEOUT_S}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def render_env_file(secrets: dict[str, str]) -> str:
    """The EnvironmentFile's text: ``NAME=value`` lines of the secrets that were set."""
    body = "".join(f"{k}={v}\n" for k, v in sorted(secrets.items()) if k in SECRET_VARS)
    return "# Secrets of a tandem service (mode 0600); read by systemd, never logged.\n" + body
