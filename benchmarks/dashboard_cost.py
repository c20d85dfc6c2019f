"""What the status page costs: one observation's wall time, and the page server's CPU beside the
engine, on a real deployment.

1. **Observation per refresh**, in this process: ``--observations`` calls of the page's one
   observation (``tandem.dashboard.observe.Observer.take``: ``tandem status --json --nodes``
   with the page's progress trackers, a canary at most once a minute), timed one by one, and
   the time to draw the page from it (``tandem.dashboard.page.document``). Reported as median
   and p95 seconds.
2. **The page server's CPU**: ``tandem dashboard NAME --refresh 2s`` as its own process, one
   open page simulated by a client fetching ``/body`` every 2 s (what the page's script does),
   CPU time (utime + stime, children included, /proc/PID/stat) read at the start and the end
   of ``--window`` seconds after its start-up; the engine's ranks' CPU over the same window
   beside it. CPU seconds per wall second = the share of one core.

With ``--load`` a bench (``tandem bench NAME --concurrency 2``) runs through both parts, so the
observation is timed while the engine is busy and the server's share is read beside a loaded
engine.

Usage (a deployment must be up, e.g. `tandem up tiny-local`):
    .venv/bin/python benchmarks/dashboard_cost.py tiny-local --window 60
    .venv/bin/python benchmarks/dashboard_cost.py tiny-local --window 60 --load
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tandem.dashboard.observe import Observer
from tandem.dashboard.page import document
from tandem.operations.lifecycle import status

TICK = os.sysconf("SC_CLK_TCK")
TANDEM = [sys.executable, "-m", "tandem.cli"]


def cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of a process, seconds (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / TICK


def engine_pids(name: str) -> list[int]:
    """Every live process of every rank of ``name``, as its status lists them."""
    shown = status(name, canary_mode="never")
    return [p.pid for group in shown.groups for rank in group.ranks for p in rank.processes]


def time_observations(name: str, count: int) -> dict[str, object]:
    observer = Observer(name, refresh_s=2.0)
    took, drawn, verdicts = [], [], []
    for _ in range(count):
        begun = time.perf_counter()
        view = observer.take()
        took.append(time.perf_counter() - begun)
        if view.error or view.status is None:
            raise SystemExit(f"the observation failed: {view.error}")
        verdicts.append(view.status.verdict.value)
        begun = time.perf_counter()
        document(view, datetime.now(UTC), lambda group, kind, found: "", live=True)
        drawn.append(time.perf_counter() - begun)
        time.sleep(max(0.0, 2.0 - took[-1] - drawn[-1]))
    took.sort()
    return {
        "observations": count,
        "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
        "observation median s": round(statistics.median(took), 3),
        "observation p95 s": round(took[int(0.95 * (len(took) - 1))], 3),
        "page drawn median s": round(statistics.median(drawn), 4),
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_share(name: str, window_s: float) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen(
        [*TANDEM, "dashboard", name, "--port", str(port), "--refresh", "2s"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/body"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        time.sleep(6)  # past the imports and the first observations
        engines = engine_pids(name)
        before = cpu_s(server.pid), sum(cpu_s(p) for p in engines)
        started = time.monotonic()
        fetched = 0
        while time.monotonic() - started < window_s:
            httpx.get(url, timeout=10).raise_for_status()
            fetched += 1
            time.sleep(2.0)
        wall = time.monotonic() - started
        after = cpu_s(server.pid), sum(cpu_s(p) for p in engines)
    finally:
        server.terminate()
        server.wait(30)
    return {
        "window s": round(wall, 1),
        "page fetches": fetched,
        "page server share of a core": round((after[0] - before[0]) / wall, 4),
        "engine share of a core (all ranks)": round((after[1] - before[1]) / wall, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--observations", type=int, default=20)
    parser.add_argument("--load", action="store_true", help="run a bench through both parts")
    args = parser.parse_args()
    load = None
    with tempfile.TemporaryDirectory(prefix="dashboard-cost-") as out:
        if args.load:
            load = subprocess.Popen(
                [*TANDEM, "bench", args.name, "--concurrency", "2", "--requests", "400",
                 "--output-tokens", "64", "--warmup", "0", "--no-plots", "--quiet",
                 "--out", out],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(5)
        try:
            figures = {"deployment": args.name, "under load": args.load}
            figures |= time_observations(args.name, args.observations)
            figures |= server_share(args.name, args.window)
        finally:
            if load is not None:  # Ctrl-C's way out; a bench that does not stop in time is killed
                load.send_signal(signal.SIGINT)
                try:
                    load.wait(30)
                except subprocess.TimeoutExpired:
                    load.kill()
                    load.wait(30)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
