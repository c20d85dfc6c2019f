"""A rolling upgrade and a canary rollback of a fleet behind vLLM's router, under load.

The fleet of ``benchmarks/router_faults.py`` (two groups of the real SmolLM2-135M-Instruct,
one rank a group, each in its own network namespace, behind the real ``vllm-router``; booted
here unless ``--home`` holds one already). While clients send chat completions through the
router at a fixed concurrency, it runs, one after the other:

- ``rolling``: ``tandem upgrade`` to a good revision (``max_num_seqs`` 8 -> 6): each group in
  turn leaves the router, drains, is stopped, started on the new revision, gated on its own
  leader and joins again, while the other serves;
- ``canary-rollback``: ``tandem upgrade`` to a revision that starts but fails the gate (the
  qwen3 reasoning parser makes all of the small model's answer reasoning): group 0, the canary,
  is rolled back to the revision it ran, and group 1 never leaves its revision.

For each: the command's exit status and wall time, requests sent and failed through the router
(goal: 0 failed), the longest time no request was answered, and the revisions each group ran
after it. Group 0's greedy answer at its own leader before the canary and after its rollback
must be the same tokens.

    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/rolling_upgrade.py
    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/router_faults.py --keep --home H
    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/rolling_upgrade.py --home H
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from router_faults import (
    API_KEY,
    GROUPS,
    MODEL,
    NAME,
    TANDEM,
    Request,
    boot,
    client_loop,
    fleet_env,
    group_endpoint,
    leftovers,
    tandem,
    tree,
    wait_ready,
    workers,
)

CHANGES = {
    "rolling": ("    max_num_seqs: 8\n", "    max_num_seqs: 6\n", 0),
    "canary-rollback": (
        "    max_num_seqs: 8\n",
        "    max_num_seqs: 8\n    reasoning_parser: qwen3\n",
        1,
    ),
}


@dataclass
class Roll:
    scenario: str
    exit: int = -1
    expected_exit: int = 0
    wall_s: float = 0.0
    requests: int = 0
    failed: int = 0
    longest_gap_s: float = 0.0
    latency_p50_s: float = 0.0
    revisions_after: dict[str, list[str]] = field(default_factory=dict)
    members_after: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    put_in_again: list[str] = field(default_factory=list)
    output_tail: str = ""


def new_recipe(home: Path, scenario: str) -> Path:
    old, new, _ = CHANGES[scenario]
    text = (home / "recipe.yaml").read_text()
    assert old in text, old
    path = home / f"recipe-{scenario}.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def longest_gap(records: list[Request], start: float, end: float) -> float:
    """The longest stretch of the window with no request answered."""
    ends = sorted(r.end for r in records if r.ok)
    marks = [start, *[e for e in ends if start <= e <= end], end]
    return max(b - a for a, b in itertools.pairwise(marks))


async def under_load(roll: Roll, argv: list[str], env: dict[str, str], concurrency: int) -> None:
    records: list[Request] = []
    stop = asyncio.Event()
    t0 = time.monotonic()
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        clients = [
            asyncio.create_task(client_loop(client, records, stop, t0)) for _ in range(concurrency)
        ]
        await asyncio.sleep(5)
        began = time.monotonic() - t0
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await process.communicate()
        ended = time.monotonic() - t0
        await asyncio.sleep(5)
        stop.set()
        await asyncio.gather(*clients)
    roll.exit = process.returncode if process.returncode is not None else -1
    roll.wall_s = round(ended - began, 1)
    said = out.decode(errors="replace")
    roll.output_tail = said[-3000:]
    roll.put_in_again = [line.strip() for line in said.splitlines() if "put in again" in line]
    roll.requests = len(records)
    failed = [r for r in records if not r.ok]
    roll.failed = len(failed)
    for r in failed:
        key = r.error.split(":")[0] or f"HTTP {r.status}"
        roll.errors[key] = roll.errors.get(key, 0) + 1
    roll.longest_gap_s = round(longest_gap(records, began, ended), 2)
    roll.latency_p50_s = round(statistics.median(r.end - r.start for r in records if r.ok), 3)


def revisions(env: dict[str, str]) -> dict[str, list[str]]:
    """Each group's revisions as ``number:outcome``, the one it runs starred."""
    rows = json.loads(tandem("history", NAME, "--json", env=env, check=True).stdout)
    record = json.loads(
        (Path(env["TANDEM_HOME"]) / "deployments" / NAME / "state.json").read_text()
    )
    shown: dict[str, list[str]] = {}
    for group in record["groups"]:
        running = group.get("revision")
        shown[group["name"]] = [
            f"{r['number']}:{r['outcome']}{'*' if r['number'] == running else ''}" for r in rows
        ]
    return shown


def greedy(home: Path) -> list[int]:
    """Group 0's greedy answer at its own leader, as token ids."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three primary colours."}],
        "max_tokens": 24,
        "temperature": 0,
        "logprobs": True,
    }
    answer = httpx.post(
        group_endpoint(home, GROUPS[0]) + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    ).json()
    return [t["token"] for t in answer["choices"][0]["logprobs"]["content"]]


def table(rolls: list[Roll]) -> str:
    rows = [
        "| scenario | exit (expected) | wall s | requests | failed | longest gap s | "
        "p50 latency s | revisions after (running *) | members after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rolls:
        revs = "; ".join(f"{g}: {' '.join(v)}" for g, v in r.revisions_after.items())
        rows.append(
            f"| {r.scenario} | {r.exit} ({r.expected_exit}) | {r.wall_s:.0f} | {r.requests} | "
            f"{r.failed} | {r.longest_gap_s} | {r.latency_p50_s} | {revs} | "
            f"{len(r.members_after)} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(CHANGES))
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--hf-home", type=Path, default=Path(tempfile.gettempdir()) / "tandem-hf")
    parser.add_argument(
        "--home", type=Path, default=None, help="TANDEM_HOME; a fleet there is reused"
    )
    parser.add_argument("--keep", action="store_true", help="Leave the fleet up at the end.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    if unknown := sorted(set(scenarios) - set(CHANGES)):
        parser.error(f"unknown {unknown}; scenarios: {', '.join(CHANGES)}")
    home, env = fleet_env(args.home, args.hf_home, "tandem-rolling-")
    extra: dict = {"home": str(home), "tree": tree()}
    print(f"tandem at {extra['tree']}", flush=True)
    extra["boot_s"] = boot(home, args.hf_home, env)
    rolls: list[Roll] = []
    try:
        for scenario in scenarios:
            extra.setdefault("by_hand", []).extend(wait_ready(env, home))
            before = greedy(home)
            roll = Roll(scenario=scenario, expected_exit=CHANGES[scenario][2])
            argv = [
                *TANDEM,
                "upgrade",
                NAME,
                "--recipe",
                str(new_recipe(home, scenario)),
                "--cluster",
                str(home / "cluster.yaml"),
                "--no-bench",
            ]
            asyncio.run(under_load(roll, argv, env, args.concurrency))
            roll.revisions_after = revisions(env)
            roll.members_after = sorted(workers())
            if scenario == "canary-rollback":
                extra["greedy_same_after_rollback"] = greedy(home) == before
            rolls.append(roll)
            print(table(rolls[-1:]).splitlines()[-1], flush=True)
    finally:
        if not args.keep:
            down = tandem("down", NAME, env=env, timeout=300)
            extra["down_rc"] = down.returncode
            extra["leftovers"] = leftovers()
        print()
        print(table(rolls))
        for r in rolls:
            for line in r.put_in_again:
                print(f"{r.scenario}: {line}")
            if r.exit != r.expected_exit or r.failed:
                print(f"\n{r.scenario}: errors {r.errors}\n{r.output_tail}")
        if "greedy_same_after_rollback" in extra:
            print(
                f"\ngroup 0's greedy tokens the same after its rollback: "
                f"{extra['greedy_same_after_rollback']}"
            )
        if "down_rc" in extra:
            print(
                f"`tandem down {NAME}` exit {extra['down_rc']}, left behind: "
                f"{', '.join(extra['leftovers']) or 'nothing'}"
            )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "config": {k: str(v) for k, v in vars(args).items()},
                        "rolls": [asdict(r) for r in rolls],
                        **extra,
                    },
                    indent=2,
                    default=str,
                )
            )
    ok = all(r.exit == r.expected_exit and r.failed == 0 for r in rolls)
    ok = ok and extra.get("greedy_same_after_rollback", True) and not extra.get("leftovers")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
