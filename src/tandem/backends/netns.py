"""Nodes as Linux network namespaces: one namespace per node, joined by veth pairs to a bridge.

Each node gets what a real host has: its own interface (named as the cluster says, e.g.
``tdm0``), its own address, and a link to the others. The bridge in the root namespace holds the
subnet's last host address, so this machine reaches every node (and the leader's API) directly,
like a laptop on the same LAN as the hosts.

    root namespace:  bridge tdmbXXXX (10.77.0.254/24) ── tdmhXXXX0 ── tdmhXXXX1
                                                            │            │ veth pairs
    namespace tdm-NAME-node0:                   tdm0 10.77.0.1/24        │
    namespace tdm-NAME-node1:                                tdm1 10.77.0.2/24

``network_plan`` is pure (names and ``ip`` commands); ``create`` and ``destroy`` run them.

Nothing a killed command made may block the next one. So ``create`` first writes a ledger entry
in ``/run/tandem/networks/`` (``/run`` is where ``ip netns`` keeps its namespaces, and like them
the ledger is gone after a reboot): which command made the network (pid and start time) and, for
a deployment, its state folder. ``sweep_orphans`` removes every network whose maker is dead and
which no deployment state claims (what a SIGKILLed ``up`` preflight or ``check --fabric`` left),
and ``destroy`` kills whatever still runs inside a namespace before deleting it, then checks that
the veth ends and the bridge are really gone.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from tandem import files, ownership
from tandem.backends.processes import ProcessIdentity, send
from tandem.errors import BackendError
from tandem.interrupts import shielded
from tandem.spec.cluster import Cluster

LEDGER_DIR = Path("/run/tandem/networks")
NETNS_DIR = Path("/run/netns")
NAMES_DIR = Path("/etc/netns")
"""``ip netns exec NS`` mounts the files of ``/etc/netns/NS/`` over ``/etc/`` for what it runs."""
_NAMES_MARK = "# written by tandem for network namespace {netns}; removed with it\n"
_NAMES_DIR_MARK = ".made-by-tandem"
"""Left in ``/etc/netns`` when tandem made that folder, so the last destroy removes it too."""


class NodeNetwork(BaseModel):
    node: str
    netns: str
    interface: str
    host_end: str
    address: str


class NetworkPlan(BaseModel):
    """Names and addresses of what ``create`` makes for a deployment."""

    bridge: str
    bridge_address: str
    prefix: int
    nodes: list[NodeNetwork]

    def netns_of(self, node: str) -> str:
        return next(n.netns for n in self.nodes if n.node == node)


def network_plan(deployment: str, cluster: Cluster) -> NetworkPlan:
    """Choose names for the bridge, namespaces and veth ends of a deployment.

    Interface names are limited to 15 characters, so the deployment is shortened to a hash.
    """
    tag = hashlib.sha1(deployment.encode()).hexdigest()[:6]
    subnet = ipaddress.ip_network(cluster.local.subnet)
    hosts = list(subnet.hosts())
    nodes = []
    for i, node in enumerate(cluster.nodes):
        if ipaddress.ip_address(node.address) not in subnet:
            raise BackendError(
                f"address {node.address} is outside the local subnet {subnet}",
                node=node.name,
                field=f"nodes[{i}].address",
                hint=f"use an address in {subnet} or change local.subnet",
            )
        nodes.append(
            NodeNetwork(
                node=node.name,
                netns=f"tdm-{deployment}-{node.name}"[:60],
                interface=node.control_plane_interface or f"tdm{i}",
                host_end=f"tdmh{tag}{i}",
                address=node.address,
            )
        )
    return NetworkPlan(
        bridge=f"tdmb{tag}", bridge_address=str(hosts[-1]), prefix=subnet.prefixlen, nodes=nodes
    )


def setup_commands(plan: NetworkPlan) -> list[list[str]]:
    """The ``ip`` commands that build the namespaces, veth pairs and bridge."""
    cmds = [
        ["ip", "link", "add", plan.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{plan.bridge_address}/{plan.prefix}", "dev", plan.bridge],
        ["ip", "link", "set", plan.bridge, "up"],
    ]
    for n in plan.nodes:
        cmds += [
            ["ip", "netns", "add", n.netns],
            [
                "ip",
                "link",
                "add",
                n.host_end,
                "type",
                "veth",
                "peer",
                "name",
                n.interface,
                "netns",
                n.netns,
            ],
            ["ip", "link", "set", n.host_end, "master", plan.bridge],
            ["ip", "link", "set", n.host_end, "up"],
            ["ip", "-n", n.netns, "link", "set", "lo", "up"],
            ["ip", "-n", n.netns, "addr", "add", f"{n.address}/{plan.prefix}", "dev", n.interface],
            ["ip", "-n", n.netns, "link", "set", n.interface, "up"],
            ["ip", "-n", n.netns, "route", "add", "default", "via", plan.bridge_address],
        ]
    return cmds


def teardown_commands(plan: NetworkPlan) -> list[list[str]]:
    """Deleting a namespace deletes its veth end and so the pair; then the bridge goes."""
    return [["ip", "netns", "del", n.netns] for n in plan.nodes] + [
        ["ip", "link", "del", plan.bridge]
    ]


class LedgerEntry(BaseModel):
    """Who made a network, so a later command can tell a live one from an orphan."""

    plan: NetworkPlan
    maker_pid: int
    maker_start_ticks: int
    state_file: str | None = None
    """The state.json of the deployment that uses the network; None for a throw-away one."""
    purpose: str = ""

    def maker_alive(self) -> bool:
        return ProcessIdentity(self.maker_pid, self.maker_start_ticks, boot=None).find() is not None

    def claimed(self) -> bool:
        """A deployment state still names this network (its ``down`` will remove it): the
        record's own ``network`` (a record of one launch) or one of its groups'."""
        if not self.state_file:
            return False
        try:
            record = json.loads(Path(self.state_file).read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict):
            return False
        groups = record.get("groups")
        groups = groups if isinstance(groups, list) else []
        networks = [
            record.get("network"),
            *(g.get("network") for g in groups if isinstance(g, dict)),
        ]
        return any(isinstance(n, dict) and n.get("bridge") == self.plan.bridge for n in networks)


def _ledger_path(plan: NetworkPlan) -> Path:
    return LEDGER_DIR / f"{plan.bridge}.json"


def _write_ledger(plan: NetworkPlan, state_file: Path | None, purpose: str) -> None:
    me = ProcessIdentity.current()
    entry = LedgerEntry(
        plan=plan,
        maker_pid=me.pid,
        maker_start_ticks=me.start_ticks,
        state_file=str(state_file.resolve()) if state_file else None,
        purpose=purpose,
    )
    LEDGER_DIR.mkdir(parents=True, exist_ok=True)
    files.write_json(_ledger_path(plan), entry)


def ledger() -> list[LedgerEntry]:
    entries = []
    for path in sorted(LEDGER_DIR.glob("*.json")) if LEDGER_DIR.is_dir() else []:
        try:
            entries.append(LedgerEntry.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
    return entries


def _made_by(*names: str) -> str:
    """`` (made by ...)`` for a network another command made, from the ledger."""
    for entry in ledger():
        mine = {
            entry.plan.bridge,
            *(n.netns for n in entry.plan.nodes),
            *(n.host_end for n in entry.plan.nodes),
        }
        if mine & set(names):
            alive = "running" if entry.maker_alive() else "exited"
            return (
                f" (made by {entry.purpose or 'a command'}, pid {entry.maker_pid} {alive}"
                + (f", state {entry.state_file}" if entry.state_file else "")
                + ")"
            )
    return ""


def sweep_orphans(on_event: Callable[[str], None] = lambda text: None) -> list[str]:
    """Remove the networks whose maker died and that no deployment claims; say what went.

    Returns what could not be removed.
    """
    leftovers: list[str] = []
    for entry in ledger():
        if entry.maker_alive() or entry.claimed():
            continue
        what = ", ".join(n.netns for n in entry.plan.nodes)
        on_event(
            f"removing what a killed {entry.purpose or 'command'} left: bridge "
            f"{entry.plan.bridge}, namespace(s) {what}"
        )
        leftovers += destroy(entry.plan)
    return leftovers


def create(plan: NetworkPlan, *, state_file: Path | None = None, purpose: str = "") -> None:
    """Build the network; on any failure remove what was made and say which step failed.

    ``state_file`` is the state of the deployment that will use the network (None for a
    throw-away one); ``purpose`` names the command in a later sweep's message.

    Raises:
        BackendError: the subnet is already in use on this machine (e.g. by another local
            deployment), or an ``ip`` command failed.
    """
    holder = _address_holder(plan.bridge_address)
    if holder:
        raise BackendError(
            f"address {plan.bridge_address} is already on interface {holder}, so "
            "this deployment's subnet would clash with another network" + _made_by(holder),
            field="local.subnet",
            hint="stop the other local deployment, or give "
            "this cluster another local.subnet (and node addresses in it)",
        )
    taken = [n.netns for n in plan.nodes if (NETNS_DIR / n.netns).exists()] + [
        d for d in [plan.bridge, *(n.host_end for n in plan.nodes)] if _link_exists(d)
    ]
    if taken:  # never touch what another command made: refuse before making anything
        raise BackendError(
            f"{', '.join(taken)} already exist(s) on this machine" + _made_by(*taken),
            field="local.subnet",
            hint="stop the deployment of the same name that runs from another "
            "TANDEM_HOME (`TANDEM_HOME=... tandem down NAME`), or rename this one",
        )
    _write_ledger(plan, state_file, purpose)
    try:
        for cmd in setup_commands(plan):
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode:
                raise BackendError(
                    f"`{' '.join(cmd)}` failed: {result.stderr.strip()}",
                    hint="run as root; `tandem down` removes a half-made network",
                )
        _write_hosts(plan)
    except BaseException:  # a failed step, or a signal (Interrupted) half-way through
        with shielded():
            destroy(plan)
        raise


def hosts_text(plan: NetworkPlan, base: str) -> str:
    """``base`` (this machine's /etc/hosts) with every node and the bridge named after it.

    A rank's torch.distributed asks the resolver for the name of each peer's address (c10d's
    client socket, an IPv4-mapped IPv6 address on its dual-stack store); inside a namespace
    this machine's DNS server is not reachable, so each such lookup waited out the resolver
    (10 s, twice a boot here). With the peers in the namespace's own hosts file, in both
    forms, the answer comes from the file at once.
    """
    lines = [base.rstrip("\n") + "\n" if base else ""]
    named = [(plan.bridge_address, plan.bridge), *((n.address, n.node) for n in plan.nodes)]
    # c10d's store listens on a dual-stack socket: its peers' addresses come as ::ffff:A.B.C.D
    lines += [f"{address}\t{name}\n::ffff:{address}\t{name}\n" for address, name in named]
    return "".join(lines)


def _write_hosts(plan: NetworkPlan) -> None:
    """``/etc/netns/NS/hosts`` for each namespace, unless that folder is someone else's
    (``/etc/netns`` made, and marked, when this machine had none). A folder an interrupted
    run of tandem left (only its marked hosts file) is written again."""
    try:
        base = Path("/etc/hosts").read_text()
    except OSError:
        base = ""
    text = hosts_text(plan, base)
    if not NAMES_DIR.exists():
        NAMES_DIR.mkdir(parents=True)
        (NAMES_DIR / _NAMES_DIR_MARK).touch()
    for node in plan.nodes:
        folder = ownership.inside(NAMES_DIR / node.netns, NAMES_DIR)
        if folder.exists() and not _ours(folder, node.netns):
            continue  # not tandem's: left alone (lookups are then only slower)
        folder.mkdir(exist_ok=True)
        files.write_text(folder / "hosts", _NAMES_MARK.format(netns=node.netns) + text)


def _ours(folder: Path, netns: str) -> bool:
    """Whether ``folder`` holds only the hosts file ``_write_hosts`` wrote for ``netns``."""
    try:
        return (
            not folder.is_symlink()
            and [p.name for p in folder.iterdir()] == ["hosts"]
            and (folder / "hosts").read_text().startswith(_NAMES_MARK.format(netns=netns))
        )
    except OSError:
        return False


def _remove_hosts(plan: NetworkPlan) -> None:
    """Remove what ``_write_hosts`` wrote: a folder holding only a hosts file with its mark,
    and ``/etc/netns`` once only its mark is left in it."""
    for node in plan.nodes:
        folder = ownership.inside(NAMES_DIR / node.netns, NAMES_DIR)
        if _ours(folder, node.netns):
            try:
                ownership.remove_file(folder / "hosts", root=NAMES_DIR)
                folder.rmdir()
            except OSError:
                continue  # the namespace's teardown goes on; the folder only slows lookups
    try:  # /etc/netns itself, when tandem made it and nothing else is left in it
        if [p.name for p in NAMES_DIR.iterdir()] == [_NAMES_DIR_MARK]:
            ownership.remove_file(NAMES_DIR / _NAMES_DIR_MARK, root=NAMES_DIR)
            NAMES_DIR.rmdir()
    except OSError:
        pass


def inode(name: str) -> str | None:
    """``net:[INODE]`` of a named namespace, as ``/proc/PID/ns/net`` of its processes reads."""
    try:
        return f"net:[{os.stat(NETNS_DIR / name).st_ino}]"
    except OSError:
        return None


def namespace_pids(name: str) -> list[int]:
    """Every process inside the named namespace (``ip netns pids``)."""
    if not (NETNS_DIR / name).exists():
        return []
    result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(word) for word in result.stdout.split() if word.isdigit()]


def destroy(plan: NetworkPlan) -> list[str]:
    """Kill what still runs inside, remove the namespaces and bridge, check that they are gone.

    Returns what could not be removed (absent is fine). A namespace is only ever made by
    ``create`` for one deployment or check, so every process in it is theirs.
    """
    for node in plan.nodes:
        send(signal.SIGKILL, namespace_pids(node.netns))
    leftovers = []
    _remove_hosts(plan)
    for cmd in teardown_commands(plan):
        result = subprocess.run(cmd, capture_output=True, text=True)
        missing = "No such file" in result.stderr or "Cannot find device" in result.stderr
        if result.returncode and not missing:
            leftovers.append(f"{' '.join(cmd)}: {result.stderr.strip()}")
    devices = [n.host_end for n in plan.nodes] + [plan.bridge]
    deadline = time.monotonic() + 5  # a veth goes when the last process of its namespace has
    while time.monotonic() < deadline and any(_link_exists(d) for d in devices):
        time.sleep(0.2)
    for device in devices:
        if _link_exists(device):
            subprocess.run(["ip", "link", "del", device], capture_output=True)
            if _link_exists(device):
                leftovers.append(f"interface {device} is still there")
    leftovers += [
        f"namespace {n.netns} is still there" for n in plan.nodes if (NETNS_DIR / n.netns).exists()
    ]
    if not leftovers:
        _ledger_path(plan).unlink(missing_ok=True)
    return leftovers


def _link_exists(device: str) -> bool:
    return (
        subprocess.run(["ip", "link", "show", "dev", device], capture_output=True).returncode == 0
    )


def _address_holder(address: str) -> str | None:
    """The interface in this namespace that already has ``address``, if any."""
    result = subprocess.run(
        ["ip", "-o", "addr", "show", "to", address], capture_output=True, text=True
    )
    fields = result.stdout.split()
    return fields[1] if len(fields) > 1 else None
