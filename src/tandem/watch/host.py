"""What one node's own files say about it: memory, the ranks' processes, GPUs, RDMA ports.

Standard library only: this file also runs as a script on remote nodes (``ssh HOST python3 -
DEPLOYMENT < host.py``, ``kubectl exec -i POD -- python3 - DEPLOYMENT``) and prints one JSON
object, ``raw_sample``'s. Nothing is parsed into tandem's models here; the caller does that, so
the remote side stays small and the parsing is tested on recorded outputs.

Sources, each optional (a missing file gives ``null``, never an error):

- ``/proc/meminfo``: MemTotal, MemAvailable, SwapTotal, SwapFree (kB -> bytes). On DGX Spark the
  GPU shares this memory and NVML reports none, so this is the memory figure there.
- ``/proc/vmstat`` ``oom_kill``: processes the kernel's OOM killer has killed since boot.
- the ranks' processes: those whose environment carries ``TANDEM_DEPLOYMENT=NAME`` (every rank
  process and its children inherit it), grouped by ``TANDEM_RANK``; per rank the summed RSS
  (``/proc/PID/statm`` resident pages) and CPU seconds (``/proc/PID/stat`` utime + stime).
- ``nvidia-smi --query-gpu=... --format=csv,nounits`` where the command exists: its text as is.
- ``/sys/class/infiniband/DEV/ports/N/``: state and the data counters (``port_xmit_data`` and
  ``port_rcv_data`` count 4-byte words).
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


def marked_pids(deployment: str, proc: str = "/proc") -> dict[int, list[int]]:
    """Rank -> pids of the live processes marked with this deployment."""
    wanted = f"{MARK_DEPLOYMENT}={deployment}".encode()
    prefix = f"{MARK_RANK}=".encode()
    ranks: dict[int, list[int]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if wanted not in environ:
            continue
        rank = next((v[len(prefix) :] for v in environ if v.startswith(prefix)), b"")
        if rank.isdigit():
            ranks.setdefault(int(rank), []).append(int(entry))
    return ranks


def process_usage(pids: list[int], proc: str = "/proc") -> dict[str, float | int]:
    """Summed RSS bytes and CPU seconds of the pids still alive (zombies count as gone)."""
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    rss, cpu, alive = 0, 0.0, 0
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"{proc}/{pid}/statm") as handle:
                resident = int(handle.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if fields[0] == "Z":
            continue
        alive += 1
        cpu += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
        rss += resident * page
    return {"processes": alive, "rss_bytes": rss, "cpu_s": round(cpu, 2)}


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


def raw_sample(
    deployment: str,
    *,
    pids: dict[int, list[int]] | None = None,
    proc: str = "/proc",
    sys_root: str = "/sys",
    gpus: bool = True,
) -> dict:
    """One node's raw facts; ``pids`` (rank -> pids) skips the scan for marked processes."""
    if pids is None:
        pids = marked_pids(deployment, proc)
    return {
        "meminfo": meminfo(proc),
        "oom_kills": oom_kills(proc),
        "ranks": {
            str(rank): {"pids": sorted(p), **process_usage(p, proc)}
            for rank, p in sorted(pids.items())
        },
        "nvidia_smi": nvidia_smi() if gpus else None,
        "rdma": rdma_ports(sys_root),
    }


def main(argv: list[str]) -> int:
    """``python3 host.py DEPLOYMENT``: print the node's raw sample as one JSON line."""
    if len(argv) != 1:
        print("usage: host.py DEPLOYMENT", file=sys.stderr)
        return 2
    print(json.dumps(raw_sample(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
