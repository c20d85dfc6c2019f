"""Real SSH hosts for tests: network namespaces on a bridge, each running its own ``sshd``.

Each host has its own address and its own OpenSSH server, started with a test-generated host
key, ``ListenAddress`` set to the host's address and key-only login with a test-generated client
key. tandem reaches them through an ssh_config file written here, so the user's ``~/.ssh`` is
never read or changed. The namespaces share this machine's filesystem (and so the engine venv
and the tiny model), but not its network: every byte between control machine and hosts, and
between the hosts, goes over the bridge.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tandem.backends import netns
from tandem.spec.cluster import Cluster

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class SSHHost:
    name: str
    address: str
    interface: str
    netns: str


@dataclass(frozen=True)
class SSHHosts:
    hosts: list[SSHHost]
    config_file: Path
    client_key: Path
    folder: Path

    def ssh(self, host: SSHHost, command: str, *, timeout: float = 30, check: bool = True):
        return subprocess.run(
            ["ssh", "-F", str(self.config_file), host.address, command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )


def available() -> str | None:
    """Why SSH hosts cannot be made here, or None when they can."""
    import os

    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen"), shutil.which("ip")):
        if not tool or not Path(tool).exists():
            return f"missing {tool or 'ssh/ssh-keygen/ip'} (apt-get install openssh-server)"
    return None


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (path.with_suffix(".pub")).read_text().strip()


@contextmanager
def ssh_hosts(
    folder: Path,
    *,
    name: str = "sshtest",
    subnet: str = "10.78.0.0/24",
    count: int = 2,
    session_env: dict[str, dict[str, str]] | None = None,
):
    """Start ``count`` namespaced hosts with sshd; yield ``SSHHosts``; remove everything after.

    ``session_env`` maps a host name (``host0``) to variables its sshd sets in every session
    (``SetEnv``), as a host's own profile would: ``DOCKER_HOST`` of the host's own daemon.
    Each host's ``HOME`` is a folder of its own unless ``session_env`` names one: a login as
    root would otherwise run this machine's ``~/.bashrc`` in every session, and the one the
    CI image ships runs ``pyenv rehash``, whose lock file a killed session leaves behind, after
    which every later session waits on it (the CI run of b08df71 lost 26 ssh tests to it).
    """
    cluster = Cluster.model_validate(
        {
            "name": name,
            "transport": "local",
            "local": {"isolation": "netns", "subnet": subnet},
            "nodes": [
                {
                    "name": f"host{i}",
                    "address": f"{subnet.rsplit('.', 1)[0]}.{i + 1}",
                    "control_plane_interface": f"tdm{i}",
                }
                for i in range(count)
            ],
        }
    )
    plan = netns.network_plan(name, cluster)
    _clear(plan)  # whatever an interrupted earlier run left
    folder.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    host_key = folder / "host_ed25519"
    host_pub = _keygen(host_key)
    client_key = folder / "client_ed25519"
    (folder / "authorized_keys").write_text(_keygen(client_key) + "\n")
    known = "".join(f"{n.address} {' '.join(host_pub.split()[:2])}\n" for n in plan.nodes)
    (folder / "known_hosts").write_text(known)
    config = folder / "ssh_config"
    config.write_text(
        "Host *\n"
        "  User root\n"
        f"  IdentityFile {client_key}\n"
        "  IdentitiesOnly yes\n"
        "  IdentityAgent none\n"
        f"  UserKnownHostsFile {folder / 'known_hosts'}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  PasswordAuthentication no\n"
    )
    servers: list[subprocess.Popen] = []
    own_env = session_env or {}
    netns.create(plan)
    try:
        hosts = []
        for node in plan.nodes:
            cfg = folder / f"sshd_{node.node}.conf"
            cfg.write_text(
                f"ListenAddress {node.address}\nPort 22\nHostKey {host_key}\n"
                f"PidFile {folder / f'sshd_{node.node}.pid'}\n"
                f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
                "StrictModes no\nUsePAM no\nMaxSessions 64\nMaxStartups 64\n"
                "AcceptEnv none\nSubsystem sftp internal-sftp\n"
                + _set_env({"HOME": str(_home(folder, node.node))} | own_env.get(node.node, {}))
            )
            log = (folder / f"sshd_{node.node}.log").open("wb")
            servers.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", node.netns, SSHD, "-D", "-e", "-f", str(cfg)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            hosts.append(SSHHost(node.node, node.address, node.interface, node.netns))
        result = SSHHosts(hosts=hosts, config_file=config, client_key=client_key, folder=folder)
        deadline = time.monotonic() + 30
        for host in hosts:
            while result.ssh(host, "true", check=False).returncode:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd on {host.address} did not accept us: "
                        f"{(folder / f'sshd_{host.name}.log').read_text()}"
                    )
                time.sleep(0.2)
        yield result
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        _clear(plan)


def _home(folder: Path, host: str) -> Path:
    """A host's own ``HOME``, empty: no profile of this machine runs in its sessions."""
    home = folder / f"home_{host}"
    home.mkdir(exist_ok=True)
    return home


def _set_env(variables: dict[str, str]) -> str:
    """One ``SetEnv`` line: sshd keeps only the first line of the keyword."""
    return (
        "SetEnv " + " ".join(f"{k}={v}" for k, v in variables.items()) + "\n" if variables else ""
    )


def _clear(plan: netns.NetworkPlan) -> None:
    """Remove the hosts: sessions sshd left (kept open by ssh's ControlMaster), namespaces, links.

    A namespace outlives ``ip netns del`` while a process or socket still holds it, and with it
    the veth pair, so the host ends are deleted explicitly too.
    """
    for node in plan.nodes:
        pids = subprocess.run(
            ["ip", "netns", "pids", node.netns], capture_output=True, text=True
        ).stdout.split()  # empty when there is no such namespace
        for pid in pids:
            subprocess.run(["kill", "-KILL", pid], capture_output=True)
    netns.destroy(plan)
    for node in plan.nodes:
        subprocess.run(["ip", "link", "del", node.host_end], capture_output=True)
