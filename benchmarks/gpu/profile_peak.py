#!/usr/bin/env python3
"""The tensors live at the peak of vLLM's profile run, from ``vllm_probe.py``'s memory history.

Runs anywhere with torch's pickle format readable (plain ``pickle``; no GPU): replays the
allocations and frees of ``profile_run-<pid>.pickle``, finds the moment torch's allocated bytes
peak (vLLM's ``torch peak memory increase``), and lists every block live then (>= 4 MiB) with
the vLLM frames that allocated it.

    python3 benchmarks/gpu/profile_peak.py /root/boots/logs/*/profile_run-*.pickle
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

MIB = 1024**2


def where(frames: list[dict]) -> str:
    """The first three vLLM frames of an allocation's Python stack."""
    found = [
        f"{f['filename'].split('/vllm/')[1]}:{f['line']}:{f['name']}"
        for f in frames
        if "/vllm/" in f["filename"]
    ]
    return " < ".join(found[:3])


def peak(path: Path) -> tuple[int, dict[int, tuple[int, str]]]:
    """(peak bytes above the recording's start, live blocks at the peak: addr -> size, where)."""
    trace = pickle.loads(path.read_bytes())["device_traces"][0]
    live: dict[int, tuple[int, str]] = {}
    current = top = 0
    at_top: dict[int, tuple[int, str]] = {}
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], where(event["frames"]))
            current += event["size"]
            if current > top:
                top, at_top = current, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            current -= live.pop(event["addr"])[0]
    return top, at_top


def main() -> None:
    for name in sys.argv[1:]:
        path = Path(name)
        top, blocks = peak(path)
        print(f"== {path.parent.name}: peak {top / 1024**3:.4f} GiB above the run's start")
        for size, frames in sorted(blocks.values(), key=lambda b: -b[0]):
            if size >= 4 * MIB:
                print(f"  {size / MIB:8.1f} MiB  {frames}")


if __name__ == "__main__":
    main()
