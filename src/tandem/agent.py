"""The node agent: what one node shows of a deployment, in one call, as one JSON object.

Every look at a running deployment (``tandem status``, each ``tandem watch`` sample, each look
of ``tandem supervise``) asks each node once, through this file: the ranks' processes there,
their log lines since the deployment became ready, and (for a watch) the node's own readings.
It is shipped as it is (``python3 - REQUEST`` over ssh, ``kubectl exec -i POD -- python3 -
REQUEST``; on this machine it is imported), so it uses only the standard library and runs on
Python 3.8 and later. Nothing is judged here: the control side types the answer
(``tandem.backends.observation``) and the health model judges it.

The request is a JSON object::

    {"deployment": "NAME", "launch": "ID or null",
     "logs": {"RANK": ["PATH", OFFSET or null], ...}, "node": true}

Sources, each optional (a missing file gives ``null``, never an error):

- the ranks' processes: those whose environment carries ``TANDEM_DEPLOYMENT=NAME`` (and
  ``TANDEM_LAUNCH=ID`` when the request names a launch; every rank process and its children
  inherit the marks, ``SPT_NOENV=1`` keeps them readable after vLLM renames a process), grouped
  by ``TANDEM_RANK``: pid, name, state letter, RSS (``/proc/PID/statm``) and CPU seconds
  (``/proc/PID/stat`` utime + stime); zombies are gone. One scan of ``/proc`` for all ranks.
- each rank's log after OFFSET (the last 256 kB of it at most); a log shorter than OFFSET was
  rotated by a restart and gives nothing.
- with ``"node": true``: ``/proc/meminfo`` (MemTotal, MemAvailable, SwapTotal, SwapFree,
  kB -> bytes; on DGX Spark the GPU shares this memory and NVML reports none, so this is the
  memory figure there), ``/proc/vmstat`` ``oom_kill`` (processes the kernel's OOM killer killed
  since boot), ``nvidia-smi --query-gpu=... --format=csv,nounits`` where the command exists
  (its text as is), and ``/sys/class/infiniband/DEV/ports/N/`` state and counters
  (``port_xmit_data`` and ``port_rcv_data`` count 4-byte words).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

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
"""The ``--query-gpu`` fields, in this order (see ``nvidia-smi --help-query-gpu``)."""

NVIDIA_SMI_ARGV = (
    "nvidia-smi",
    "--query-gpu=" + ",".join(NVIDIA_SMI_FIELDS),
    "--format=csv,nounits",
)
MARK_DEPLOYMENT = "TANDEM_DEPLOYMENT"
MARK_RANK = "TANDEM_RANK"
MARK_LAUNCH = "TANDEM_LAUNCH"
"""``tandem.wire``'s names, spelt again because this file runs where tandem is not installed
(a test holds them equal)."""
LOG_MAX_BYTES = 256_000
_MEMINFO_KEYS = ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree")
_RDMA_COUNTERS = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_discards",
    "symbol_error",
    "link_downed",
)


def meminfo(proc: str = "/proc") -> dict[str, int] | None:
    """MemTotal, MemAvailable, SwapTotal, SwapFree in bytes."""
    try:
        with open(f"{proc}/meminfo") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    found = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in _MEMINFO_KEYS:
            found[key] = int(rest.split()[0]) * 1024
    return found


def oom_kills(proc: str = "/proc") -> int | None:
    """The kernel's OOM kill count since boot (``oom_kill`` in /proc/vmstat, Linux >= 4.13)."""
    try:
        with open(f"{proc}/vmstat") as handle:
            for line in handle:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rank_processes(
    deployment: str, launch: str | None = None, proc: str = "/proc"
) -> dict[int, list[dict]]:
    """Rank -> its live processes (pid, name, state, rss_bytes, cpu_s), in one /proc scan."""
    wanted = [f"{MARK_DEPLOYMENT}={deployment}".encode()]
    if launch:
        wanted.append(f"{MARK_LAUNCH}={launch}".encode())
    prefix = f"{MARK_RANK}=".encode()
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    ranks: dict[int, list[dict]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
            if any(mark not in environ for mark in wanted):
                continue
            with open(f"{proc}/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"{proc}/{entry}/statm") as handle:
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


def log_since(path: str, offset: int | None, max_bytes: int = LOG_MAX_BYTES) -> list[str]:
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


def nvidia_smi(timeout_s: float = 10.0) -> str | None:
    """``nvidia-smi``'s CSV for the watched fields, or None where there is no nvidia-smi."""
    if shutil.which(NVIDIA_SMI_ARGV[0]) is None:
        return None
    try:
        result = subprocess.run(NVIDIA_SMI_ARGV, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return result.stdout if result.returncode == 0 else f"error: {result.stderr.strip()}"


def rdma_ports(sys_root: str = "/sys") -> list[dict]:
    """Each RDMA port's state and counters, from sysfs."""
    base = f"{sys_root}/class/infiniband"
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return []
    ports = []
    for device in devices:
        try:
            numbers = sorted(os.listdir(f"{base}/{device}/ports"))
        except OSError:
            continue
        for number in numbers:
            folder = f"{base}/{device}/ports/{number}"
            port = {"device": device, "port": int(number), "state": _read(f"{folder}/state")}
            for counter in _RDMA_COUNTERS:
                value = _read(f"{folder}/counters/{counter}")
                port[counter] = int(value) if value and value.isdigit() else None
            ports.append(port)
    return ports


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def node_readings(proc: str = "/proc", sys_root: str = "/sys", gpus: bool = True) -> dict:
    """The node's own readings: memory, OOM kills, GPUs, RDMA ports."""
    return {
        "meminfo": meminfo(proc),
        "oom_kills": oom_kills(proc),
        "nvidia_smi": nvidia_smi() if gpus else None,
        "rdma": rdma_ports(sys_root),
    }


def look(request: dict, proc: str = "/proc", sys_root: str = "/sys") -> dict:
    """The answer to one request (the module docstring's): processes, logs, readings."""
    logs = request.get("logs") or {}
    return {
        "ranks": {
            str(rank): found
            for rank, found in rank_processes(
                request["deployment"], request.get("launch"), proc
            ).items()
        },
        "logs": {rank: log_since(path, offset) for rank, (path, offset) in logs.items()},
        "node": node_readings(proc, sys_root) if request.get("node") else None,
    }


def main(argv: list[str]) -> int:
    """``python3 agent.py REQUEST``: print the answer as one JSON line."""
    if len(argv) != 1:
        print("usage: agent.py REQUEST_JSON", file=sys.stderr)
        return 2
    print(json.dumps(look(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
