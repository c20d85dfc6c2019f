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

It is also the Kubernetes liveness probe (``python3 -c SOURCE alive ROLE --deployment NAME ...``
as an ``exec`` probe in every rank's pod; vLLM's images have Python), because vLLM has no
endpoint that means "the engine makes progress": ``/health`` stays 200 while a worker is gone or
an all-reduce hangs. It applies ``tandem.health``'s rules where the kubelet can act on them:

- every role: the rank's vLLM processes (``VLLM::Worker_TPn``, and ``VLLM::EngineCore`` on the
  leader) are among the processes above and none is stopped;
- leader: ``/health`` is 200; under load (``vllm:num_requests_running`` > 0) the token counters
  moved within ``--stall`` seconds (kept between runs in ``--state-file``); idle, a 1-token
  canary completion answers within ``--canary-timeout``.

Exit 0 prints ``alive``; 1 prints the reason (the kubelet records it in the pod's events) and,
after ``failureThreshold`` failures, restarts the container, which LeaderWorkerSet turns into a
restart of the whole group (``RecreateGroupOnPodRestart``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

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
TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
RUNNING = "vllm:num_requests_running"
"""vLLM's metric names (``tandem.vllm_metrics`` spells them for the control side)."""
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


def stopped_or_missing(role: str, deployment: str, proc: str = "/proc") -> str | None:
    """Why the rank's vLLM processes here are not all running, or None."""
    found = [p for procs in rank_processes(deployment, None, proc).values() for p in procs]
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


def _http(url: str, key: str | None, timeout: float, body: dict | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.read().decode(errors="replace")


def token_counters(text: str) -> dict[str, float]:
    """The token counters and running requests of a ``/metrics`` page, summed over engines."""
    values: dict[str, float] = {}
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


def leader_stalled(args: argparse.Namespace, key: str | None) -> str | None:
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


def alive(argv: list[str]) -> int:
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
    problem = stopped_or_missing(args.role, args.deployment)
    if problem is None and args.role == "leader":
        problem = leader_stalled(args, os.environ.get("VLLM_API_KEY"))
    if problem:
        print(f"not alive: {problem}")
        return 1
    print("alive")
    return 0


def main(argv: list[str]) -> int:
    """``agent.py REQUEST``: print the answer as one JSON line; ``agent.py alive ...``: the
    liveness probe."""
    if argv[:1] == ["alive"]:
        return alive(argv[1:])
    if len(argv) != 1:
        print("usage: agent.py REQUEST | agent.py alive ROLE --deployment NAME", file=sys.stderr)
        return 2
    print(json.dumps(look(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
