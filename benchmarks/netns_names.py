"""How long a local boot across namespaces waits on reverse DNS, with and without their hosts file.

Inside tandem's namespaces this machine's resolver is out of reach, and torch.distributed's
store asks it for the name of each peer's address. ``netns.create`` writes each namespace a
hosts file naming every node (``/etc/netns/NS/hosts``); this script brings ``tiny-local`` (TP 2
across two namespaces) up with that file and, alternately, with ``netns._write_hosts`` replaced
by nothing, and prints each ``tandem up``'s wall time and the span from rank 0's rendezvous to
its API server, where the lookups fell.

Usage (as root, from the project root, after `make install`; 2 x ROUNDS boots, ~50 s each):

    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/netns_names.py --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tandem.backends import netns
from tandem.cli import main as tandem

NAME = "tiny-local"
PHASE = re.compile(r"^\s*([\d.]+)s\s+rank 0\s+(rendezvous|api server up)", re.MULTILINE)


def boot(home: Path, hf_home: Path, names: bool) -> tuple[float, float]:
    """(``tandem up`` wall seconds, rendezvous to API server seconds) of one boot, then down."""
    os.environ.update(TANDEM_HOME=str(home), HF_HOME=str(hf_home), VLLM_API_KEY="bench")
    real = netns._write_hosts
    if not names:
        netns._write_hosts = lambda plan: None  # type: ignore[assignment]
    said = io.StringIO()
    started = time.monotonic()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            code = tandem(["up", NAME])
    finally:
        netns._write_hosts = real  # type: ignore[assignment]
        wall = time.monotonic() - started
        subprocess.run(
            [sys.executable, "-m", "tandem.cli", "down", NAME], capture_output=True, check=False
        )
    if code:
        sys.exit(f"tandem up failed ({code}):\n{said.getvalue()}")
    phases = {phase: float(at) for at, phase in PHASE.findall(said.getvalue())}
    return wall, phases["api server up"] - phases["rendezvous"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        hf_home = Path(scratch) / "hf"
        subprocess.run(
            [sys.executable, "-m", "tandem.cli", "model", "tiny", "--hf-home", str(hf_home)],
            capture_output=True,
            check=True,
        )
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for round_ in range(opts.rounds):
            for names in (False, True):
                wall, span = boot(Path(scratch) / f"home-{round_}-{names}", hf_home, names)
                runs[names].append((wall, span))
                label = "with hosts file   " if names else "without hosts file"
                print(f"round {round_} {label}  up {wall:5.1f} s  rendezvous -> API {span:4.1f} s")
    print("\nmedians             tandem up   rendezvous -> API server")
    for names in (False, True):
        label = "with hosts file   " if names else "without hosts file"
        wall = statistics.median(w for w, _ in runs[names])
        span = statistics.median(s for _, s in runs[names])
        print(f"{label}   {wall:7.1f} s   {span:7.1f} s")


if __name__ == "__main__":
    main()
