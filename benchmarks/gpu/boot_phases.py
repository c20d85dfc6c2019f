#!/usr/bin/env python3
"""The phases of each recorded CUDA boot, with times, read from the leader's log by tandem's
own ``BootLog`` (the reader ``tandem up`` uses) and vLLM's time stamps.

    python3 benchmarks/gpu/boot_phases.py tests/fixtures/gpu > benchmarks/gpu/results/phases.md

Times are seconds after the process started (``boots.jsonl``'s ``started``; vLLM stamps whole
seconds in the machine's local time, here UTC).
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

from tandem.vllm_log import BootLog, Phase

_STAMP = re.compile(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
_ENGINE = re.compile(r"Initializing a V1 LLM engine")
COLUMNS = [Phase.RENDEZVOUS, Phase.WEIGHTS_LOADED, Phase.COMPILED, Phase.KV_CACHE]


def stamp(line: str, year: int) -> float | None:
    m = _STAMP.search(line)
    if not m:
        return None
    mo, d, h, mi, s = map(int, m.groups())
    return datetime(year, mo, d, h, mi, s, tzinfo=UTC).timestamp()


def phases(log_text: str, started: float) -> dict[str, float]:
    year = datetime.fromtimestamp(started, UTC).year
    log, out = BootLog(rank=0), {}
    for line in log_text.splitlines():
        t = stamp(line, year)
        if t is None:
            continue
        out.setdefault("first log line", t - started)
        if _ENGINE.search(line):
            out.setdefault("engine core", t - started)
        for phase, _ in log.feed(line):
            out.setdefault(phase.value, t - started)
    return out


def main() -> None:
    fixtures = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gpu")
    heads = ["first log line", "engine core"] + [p.value for p in COLUMNS]
    print("| boot | " + " | ".join(heads) + " | KV line seen by the runner |")
    print("|---|" + "---:|" * (len(heads) + 1))
    for raw in (fixtures / "boots" / "boots.jsonl").read_text().splitlines():
        boot = json.loads(raw)
        text = (fixtures / "boots" / f"{boot['boot']}-rank0.log").read_text(errors="replace")
        got = phases(text, boot["started"])
        cells = [f"{got[h]:.0f}" if h in got else "—" for h in heads]
        seen = f"{boot['seconds_to_line']:.1f}" if boot["seconds_to_line"] else boot["status"]
        print(f"| {boot['boot']} | " + " | ".join(cells) + f" | {seen} |")


if __name__ == "__main__":
    main()
