"""Commands on remote nodes through the system's OpenSSH client.

Using ``ssh`` itself (not a Python SSH library) means the user's ``~/.ssh/config``, agent,
``ProxyJump`` hosts and known_hosts all apply unchanged. On top of it this module adds:

- **connection reuse**: one ControlMaster connection per host (``ControlPersist``), so the
  many short commands of a readiness wait or ``logs -f`` cost milliseconds, not a handshake;
- **parallel commands** across nodes (``run_all``), each with a timeout;
- **clear errors**: ssh's exit status 255 and its stderr are mapped once, here, to
  ``SSHError`` with ``reason`` unreachable, key-refused or command-missing.

Scripts travel on the command's stdin to ``sh -s``, never on the command line, so the values of
variables (an HF token) do not show in ``ps`` on either side.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tandem.errors import SSHError
from tandem.spec.cluster import Cluster, Node

SSH_CONFIG_ENV = "TANDEM_SSH_CONFIG"
"""An ssh_config file for every ssh tandem runs, when the cluster names none."""

_UNREACHABLE = (
    "Connection refused",
    "No route to host",
    "Connection timed out",
    "Could not resolve hostname",
    "Network is unreachable",
    "Connection closed",
    "Connection reset",
    "timed out",
    "Name or service not known",
)
_KEY_REFUSED = (
    "Permission denied",
    "Too many authentication failures",
    "no mutual signature algorithm",
)

_PY_EOF = "TANDEM_PY_EOF_7f3a"

K = TypeVar("K", str, int)
"""A key of `OpenSSH.run_all`'s jobs: a node's name or a rank."""


def engine_python(vllm_command: str) -> str:
    """The Python beside the configured ``vllm`` (the engine's venv), else ``python3``."""
    vllm = shlex.split(vllm_command)[0]
    if vllm.startswith("/"):
        return vllm.rsplit("/", 1)[0] + "/python3"
    return "python3"


@dataclass(frozen=True)
class SSHTarget:
    """Where one node's commands go: ``[user@]host`` and port, named after the node."""

    node: str
    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def of(cls, node: Node) -> SSHTarget:
        return cls(
            node=node.name,
            host=node.ssh_host or node.address,
            user=node.ssh_user,
            port=node.ssh_port,
        )

    @property
    def destination(self) -> str:
        """``user@host`` or ``host``, as ssh and rsync write it."""
        return f"{self.user}@{self.host}" if self.user else self.host


@dataclass(frozen=True)
class Result:
    """What a remote command did."""

    returncode: int
    stdout: str
    stderr: str
    raw: bytes = b""
    """stdout as bytes, for readers that count byte offsets (logs)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def classify(
    target: SSHTarget, returncode: int, stderr: str, *, program: str = ""
) -> SSHError | None:
    """The ``SSHError`` an ssh exit means, or None when the remote command itself ran.

    ssh exits 255 when it could not run the command; a shell exits 127 for a missing program.
    """
    text = stderr.strip()
    last = text.splitlines()[-1] if text else ""
    if returncode == 255:
        if any(s in text for s in _KEY_REFUSED):
            return SSHError(
                f"{target.destination} refused our key: {last}",
                reason=SSHError.KEY_REFUSED,
                node=target.node,
                hint="add your public key to the node's authorized_keys "
                f"(`ssh-copy-id {target.destination}`) or load it in ssh-agent",
            )
        if any(s in text for s in _UNREACHABLE) or not text:
            return SSHError(
                f"cannot reach {target.destination}: {last or 'ssh exited 255'}",
                reason=SSHError.UNREACHABLE,
                node=target.node,
                hint=f"check that `ssh {target.destination} true` works from here "
                "(address, port, firewall, ssh_host in the cluster file)",
            )
        return SSHError(
            f"ssh to {target.destination} failed: {last}",
            reason=SSHError.UNREACHABLE,
            node=target.node,
            hint=f"run `ssh -v {target.destination} true` to see why",
        )
    if returncode == 127:
        what = program or (last.split(":")[0] if last else "a command")
        return SSHError(
            f"{what} is not installed on {target.node} (or not on the login PATH): {last}",
            reason=SSHError.COMMAND_MISSING,
            node=target.node,
            hint="install it on the node, or give its full path in the cluster's "
            "ssh section (vllm_command, docker_command)",
        )
    return None


class OpenSSH:
    """Runs shell scripts on nodes with ``ssh``; one shared connection per host.

    Usage:
        ssh = OpenSSH.for_cluster(cluster)
        result = ssh.run(SSHTarget.of(cluster.nodes[1]), "uname -r")
        results = ssh.run_all({t.node: (t, "uptime") for t in targets})

    **Parameters:**

    * **config_file** - *(optional)* an ssh_config passed as ``-F``; default ssh's own.
    * **connect_timeout_s** - *(optional)* ssh's ConnectTimeout. Default 10.
    * **control_dir** - *(optional)* where the ControlMaster sockets live; default a short
      private folder in the system temp dir (socket paths must stay under 108 bytes).
    """

    def __init__(
        self,
        *,
        config_file: str | None = None,
        connect_timeout_s: float = 10,
        control_dir: Path | None = None,
    ) -> None:
        self.config_file = config_file
        self.connect_timeout_s = connect_timeout_s
        self.control_dir = control_dir or Path(tempfile.gettempdir()) / f"tandem-ssh-{os.getuid()}"

    @classmethod
    def for_cluster(cls, cluster: Cluster) -> OpenSSH:
        """The transport a cluster's ``ssh:`` section (or ``$TANDEM_SSH_CONFIG``) describes."""
        config = cluster.ssh.config_file or os.environ.get(SSH_CONFIG_ENV) or None
        return cls(config_file=config, connect_timeout_s=cluster.ssh.connect_timeout_s)

    def options(self) -> list[str]:
        """ssh options without the destination: config file, batch mode, reuse, keep-alives."""
        opts = ["-F", self.config_file] if self.config_file else []
        settings = (
            "BatchMode=yes",
            f"ConnectTimeout={int(self.connect_timeout_s)}",
            "ControlMaster=auto",
            f"ControlPath={self.control_dir}/{self._config_tag()}-%C",
            "ControlPersist=120",
            "ServerAliveInterval=5",
            "ServerAliveCountMax=3",
            "LogLevel=ERROR",
        )
        return [*opts, *(word for setting in settings for word in ("-o", setting))]

    def _config_tag(self) -> str:
        """Connections made under one ssh_config are never reused under another (keys differ)."""
        return hashlib.sha1((self.config_file or "").encode()).hexdigest()[:8]

    def argv(self, target: SSHTarget, remote: Sequence[str]) -> list[str]:
        """The full local ``ssh`` command that runs ``remote`` on ``target``."""
        port = ["-p", str(target.port)] if target.port else []
        user = ["-l", target.user] if target.user else []
        return ["ssh", *self.options(), *port, *user, target.host, "--", shlex.join(remote)]

    def run(
        self,
        target: SSHTarget,
        script: str,
        *,
        timeout_s: float = 60,
        check: bool = True,
        program: str = "",
    ) -> Result:
        """Run a POSIX shell script on a node (sent on stdin to ``sh -s``).

        Raises:
            SSHError: unreachable, key refused, a timeout, or (with ``check``) a missing
                program (exit 127); any other exit status is returned in the result.
        """
        self.control_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            done = subprocess.run(
                self.argv(target, ["sh", "-s"]),
                input=script.encode(),
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise SSHError(
                f"no answer from {target.destination} within {timeout_s:.0f} s",
                reason=SSHError.UNREACHABLE,
                node=target.node,
                hint="the node is overloaded or the network drops packets; "
                f"check `ssh {target.destination} uptime`",
            ) from exc
        result = Result(
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
            done.stdout,
        )
        error = classify(target, result.returncode, result.stderr, program=program)
        if error and (check or error.reason != SSHError.COMMAND_MISSING):
            raise error
        return result

    def run_python(
        self,
        target: SSHTarget,
        source: str,
        args: Sequence[str] = (),
        *,
        python: str = "python3",
        env: dict[str, str] | None = None,
        timeout_s: float = 60,
        check: bool = True,
    ) -> Result:
        """Run a standard-library Python file on a node: the source on stdin (``python -
        ARGS``), with ``python`` (the engine's) where it is there, else the node's ``python3``,
        and ``env`` exported first. The one way tandem's node scripts reach an ssh node (the
        preflight's probe, the node agent)."""
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in (env or {}).items())
        script = (
            f'{exports}py={shlex.quote(python)}; [ -x "$py" ] || py=python3\n'
            f"\"$py\" - {shlex.join(args)} <<'{_PY_EOF}'\n{source}\n{_PY_EOF}\n"
        )
        return self.run(target, script, timeout_s=timeout_s, check=check, program="python3")

    def run_all(
        self, jobs: dict[K, tuple[SSHTarget, str]], *, timeout_s: float = 60, check: bool = True
    ) -> dict[K, Result]:
        """Run one script per key (a node's name, a rank) in parallel; raise the first node's
        error, if any."""
        if not jobs:
            return {}
        with ThreadPoolExecutor(max_workers=min(16, len(jobs))) as pool:
            futures = {
                key: pool.submit(self.run, target, script, timeout_s=timeout_s, check=check)
                for key, (target, script) in jobs.items()
            }
            return {key: future.result() for key, future in futures.items()}
