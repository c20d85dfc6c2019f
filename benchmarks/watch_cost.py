"""The CPU that `tandem watch` costs at its default 5 s interval, on a real deployment.

Starts `tandem watch NAME --interval 5s --quiet --out TMP` as its own process against a running
deployment, lets it get past its start-up (imports, the first samples), then reads the
process's CPU time (utime + stime from /proc/PID/stat, children included: nvidia-smi where
there is one) at the start and the end of a measured window. The figure is CPU seconds per
wall second, i.e. the share of one core; the issue's budget is 1 %. Also reported: the mean
wall time of one sample (``cost_s`` in samples.jsonl), most of it waiting on the leader's
/metrics and the rank liveness checks, and the start-up CPU that a long soak amortizes.

And what one sample asks of the leader and of the nodes, counted in this process by a watch of
``--count-samples`` samples at a 1 s interval (``Watcher.run``, the loop ``tandem watch`` runs):
the HTTP requests by path (``/metrics``, ``/health``; canaries apart, at most one a minute) and
the scans of ``/proc`` (on the local backend every node is this machine, so a scan is the round
trip an ssh node pays as one ``ssh`` call). vLLM does not count its own ``/metrics`` and
``/health`` requests (its instrumentator excludes them), so the count is the client's.

Usage (a deployment must be up, e.g. `tandem up tiny-local`):
    .venv/bin/python benchmarks/watch_cost.py tiny-local --window 120
    .venv/bin/python benchmarks/watch_cost.py tiny-local --window 60 --live   # with the live view
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / TICK


def counted_sample_costs(name: str, samples: int) -> dict[str, float]:
    """Requests by path and /proc scans per sample, over ``samples`` samples in this process."""
    from tandem.watch.sampler import Watcher

    counts: dict[str, int] = {}
    send, listdir, scandir = httpx.Client.send, os.listdir, os.scandir

    def counting_send(self, request, *args, **kwargs):
        counts[request.url.path] = counts.get(request.url.path, 0) + 1
        return send(self, request, *args, **kwargs)

    def counting_listdir(path="."):
        if str(path) == "/proc":
            counts["/proc scans"] = counts.get("/proc scans", 0) + 1
        return listdir(path)

    def counting_scandir(path="."):
        if str(path) == "/proc":
            counts["/proc scans"] = counts.get("/proc scans", 0) + 1
        return scandir(path)

    # Path.iterdir lists through one of these two, so each scan counts once
    httpx.Client.send, os.listdir, os.scandir = counting_send, counting_listdir, counting_scandir
    try:
        with tempfile.TemporaryDirectory(prefix="watch-count-") as out:
            Watcher(name, Path(out), interval_s=1.0, duration_s=samples - 0.5).run()
            taken = _samples_taken(Path(out))
    finally:
        httpx.Client.send, os.listdir, os.scandir = send, listdir, scandir
    return {f"{key} per sample": round(n / taken, 2) for key, n in sorted(counts.items())} | {
        "counted samples": taken
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the running deployment")
    parser.add_argument("--interval", default="5s")
    parser.add_argument("--warmup", type=float, default=12.0, help="seconds before measuring")
    parser.add_argument("--window", type=float, default=120.0, help="seconds measured")
    parser.add_argument("--live", action="store_true", help="with the live terminal view")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--count-samples", type=int, default=10, help="samples whose requests are counted"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-cost-") as out:
        argv = [
            sys.executable,
            "-m",
            "tandem.cli",
            "watch",
            args.name,
            "--interval",
            args.interval,
            "--out",
            out,
            *([] if args.live else ["--quiet"]),
        ]
        started = time.monotonic()
        # --live renders as on a terminal (rich reads these), into /dev/null
        env = {**os.environ, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120"}
        watch = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        try:
            time.sleep(args.warmup)
            if watch.poll() is not None:
                print(f"tandem watch exited {watch.returncode}", file=sys.stderr)
                return 1
            cpu0, wall0 = cpu_s(watch.pid), time.monotonic()
            time.sleep(args.window)
            cpu1, wall1 = cpu_s(watch.pid), time.monotonic()
        finally:
            watch.terminate()
            watch.wait(30)
        samples = [
            json.loads(line) for line in (Path(out) / "samples.jsonl").read_text().splitlines()
        ]
    measured = [s for s in samples if s["cost_s"] is not None]
    figures = {
        "interval": args.interval,
        "window_s": round(wall1 - wall0, 1),
        "samples": len(samples),
        "cpu_share_of_one_core_pct": round((cpu1 - cpu0) / (wall1 - wall0) * 100, 3),
        "cpu_per_sample_ms": round(
            (cpu1 - cpu0) * 1000 / max(1, (wall1 - wall0) / _seconds(args.interval)), 1
        ),
        "startup_cpu_s": round(cpu0, 2),
        "mean_sample_wall_ms": round(sum(s["cost_s"] for s in measured) / len(measured) * 1000, 1),
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    figures |= counted_sample_costs(args.name, args.count_samples)
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:28} {value}")
    return 0


def _samples_taken(out: Path) -> int:
    path = out / "samples.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _seconds(text: str) -> float:
    return float(text.rstrip("s"))


if __name__ == "__main__":
    sys.exit(main())
