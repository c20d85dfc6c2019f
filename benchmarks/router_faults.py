"""Faults in one group of a fleet behind vLLM's router, under load: what clients see.

Two groups of the real SmolLM2-135M-Instruct (the built-in ``smollm2-replicas`` recipe, one
rank a group, each its own network namespace) behind the real ``vllm-router``. For each mode
and fault kind the script starts ``tandem supervise`` in the background, sends chat
completions through the router at a fixed concurrency, injects the fault into group 1's rank
after a warm-up, and keeps the load on until group 1 is back in the router's rotation (plus a
short tail), at most ``--max-after`` seconds after the fault. Every request is recorded (start,
end, status or error). Just before the fault it reads group 1's leader ``/metrics``
(``vllm:num_requests_running`` + ``vllm:num_requests_waiting``): the requests in flight on the
killed group, the only ones a fault may fail if membership works. The router's ``/workers``
(listed, ``is_healthy``) is polled every 0.2 s for the times to leave and to rejoin rotation.

Modes:

- ``tandem``: ``tandem supervise`` takes the broken group out of the router before its restart
  and puts it back after its canary answered (``tandem.operations.supervisor.leave_rotation`` /
  ``join_rotation``);
- ``router-only``: the same supervise with ``--no-router-membership``: the group is still
  restarted, but membership is left to the router itself (its ``/health`` poll every 60 s, 3
  failures to mark a worker unhealthy; its retries and circuit breaker).

Fault kinds, on group 1's single rank: ``leader-kill`` (SIGKILL of the main ``vllm``
process), ``engine-kill`` (SIGKILL of ``VLLM::EngineCore``), ``engine-stop`` (SIGSTOP of
``VLLM::EngineCore``: a wedged engine whose API server may still answer ``/health`` 200).

Usage (as root, from the project root; one engine at a time on a shared machine):

    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/router_faults.py
    .venv/bin/python benchmarks/router_faults.py --kinds engine-stop --modes tandem --json o.json

The fleet is booted once for the whole run (``tandem up``) and taken down at the end
(``tandem down``), which must leave no process, namespace or listening router port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TANDEM = [sys.executable, "-m", "tandem.cli"]
NAME = "rfaults"
GROUPS = [f"{NAME}-g0", f"{NAME}-g1"]
ROUTER_PORT, METRICS_PORT = 8160, 8161
ROUTER = f"http://127.0.0.1:{ROUTER_PORT}"
API_KEY = "rfaults-key"
MODEL = "smollm2"

CLUSTER = """\
name: rfaults
transport: local
local: {isolation: netns, subnet: 10.91.0.0/24}
nodes:
  - {name: node0, address: 10.91.0.1, control_plane_interface: tdm0,
     cpus: "0", env: {VLLM_CPU_OMP_THREADS_BIND: "0"}}
  - {name: node1, address: 10.91.0.2, control_plane_interface: tdm1,
     cpus: "1", env: {VLLM_CPU_OMP_THREADS_BIND: "1"}}
"""

# kind -> (process name as the kernel shows it, signal)
KINDS: dict[str, tuple[str, signal.Signals]] = {
    "leader-kill": ("vllm", signal.SIGKILL),
    "engine-kill": ("VLLM::EngineCor", signal.SIGKILL),
    "engine-stop": ("VLLM::EngineCor", signal.SIGSTOP),
}
MODES: dict[str, str] = {"tandem": "--router-membership", "router-only": "--no-router-membership"}
TOPICS = ["a river", "the moon", "bread", "a violin", "winter", "a lighthouse", "bees", "chess"]


@dataclass
class Request:
    start: float
    end: float = 0.0
    ok: bool = False
    status: int | None = None
    error: str = ""


@dataclass
class Scenario:
    mode: str
    kind: str
    target: str = ""
    requests: int = 0
    failed: int = 0
    failed_started_after_fault: int = 0
    in_flight_g1: int | None = None
    in_flight_client: int = 0
    failed_beyond_in_flight: int = 0
    failed_before_fault: int = 0
    leave_s: float | None = None
    leave_how: str = ""
    rejoin_s: float | None = None
    answers_again_s: float | None = None
    window_s: float = 0.0
    warmup_share_g1: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    membership: list[list] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    fault_at: float = 0.0
    fault_monotonic: float = 0.0
    requests_detail: list[dict] = field(default_factory=list)


# ---------------------------------------------------------------------------------- fleet


def tandem(*args: str, env: dict[str, str], timeout: float = 900, check: bool = False):
    return subprocess.run(
        [*TANDEM, *args], env=env, capture_output=True, text=True, timeout=timeout, check=check
    )


def recipe_text() -> str:
    text = (ROOT / "src/tandem/recipes/smollm2-replicas.yaml").read_text()
    for old, new in [
        ("name: smollm2-replicas", f"name: {NAME}"),
        ("  port: 8100", f"  port: {ROUTER_PORT}"),
        ("  metrics_port: 8190", f"  metrics_port: {METRICS_PORT}"),
    ]:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def status(env: dict[str, str]) -> dict:
    out = tandem("status", NAME, "--json", env=env, timeout=120)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {"verdict": "unknown", "reason": out.stdout[-300:] + out.stderr[-300:]}


def workers() -> dict[str, bool]:
    """The router's members: url -> is_healthy."""
    body = httpx.get(ROUTER + "/workers", timeout=5).json()
    return {w["url"]: bool(w["is_healthy"]) for w in body["workers"]}


def group_record(home: Path, group: str) -> dict:
    """Group ``NAME-gG``'s record inside the deployment's one ``state.json``."""
    record = json.loads((home / "deployments" / NAME / "state.json").read_text())
    return next(g for g in record["groups"] if g["name"] == group)


def group_endpoint(home: Path, group: str) -> str:
    return group_record(home, group)["endpoint"]


def wait_ready(env: dict[str, str], home: Path, timeout_s: float = 420) -> list[str]:
    """Until tandem says healthy and the router lists both groups as healthy members. A group
    healthy by tandem's verdict but out of the router for 20 s (a baseline that left it out)
    is added by hand; one listed but unhealthy for 150 s is removed and added again. Returns
    what was done by hand."""
    notes: list[str] = []
    started = time.monotonic()
    out_since: dict[str, float] = {}
    while time.monotonic() - started < timeout_s:
        shown = status(env)
        try:
            members = workers()
        except (httpx.HTTPError, ValueError, KeyError):
            members = {}
        wanted = [g["endpoint"] for g in shown.get("groups", []) if g.get("endpoint")]
        if (
            shown.get("verdict") == "healthy"
            and len(wanted) == len(GROUPS)
            and all(members.get(url) for url in wanted)
        ):
            return notes
        for g in shown.get("groups", []):
            url = g.get("endpoint")
            if g.get("verdict") != "healthy" or not url or members.get(url):
                out_since.pop(url, None)
                continue
            since = out_since.setdefault(url, time.monotonic())
            listed = url in members
            if (not listed and time.monotonic() - since > 20) or time.monotonic() - since > 150:
                if listed:
                    httpx.post(ROUTER + "/remove_worker", params={"url": url}, timeout=30)
                answer = httpx.post(ROUTER + "/add_worker", params={"url": url}, timeout=30)
                notes.append(
                    f"{g['name']} healthy but {'unhealthy in' if listed else 'out of'} the "
                    f"router for {time.monotonic() - since:.0f} s: "
                    f"{'removed and ' if listed else ''}added by hand ({answer.status_code})"
                )
                out_since.pop(url, None)
        time.sleep(2)
    raise SystemExit(f"fleet not healthy with both members within {timeout_s:.0f} s: {shown}")


def leftovers() -> list[str]:
    from tandem.backends.processes import marked_processes

    found = [f"process {pid} of {g}" for g in GROUPS for pid in marked_processes(g)]
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [line.split()[0] for line in namespaces.splitlines() if NAME in line]
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", ROUTER_PORT)) == 0:
            found.append(f"something listens on {ROUTER_PORT}")
    return found


# ---------------------------------------------------------------------------------- fault


def find_target(home: Path, what: str):
    """Group 1's rank 0 process named ``what``: its main process, or a child of it in /proc."""
    from tandem.backends.processes import all_processes, read_process

    leader = group_record(home, GROUPS[1])["ranks"][0]
    main = read_process(leader["pid"])
    if main is None:
        raise SystemExit(f"group 1's main process {leader['pid']} is gone before the fault")
    if what == "vllm":
        return main
    children = [p for p in all_processes() if p.ppid == main.pid and p.name.startswith(what)]
    if not children:
        raise SystemExit(f"no {what} child of {main.pid}")
    return children[0]


def inject(process, sig: signal.Signals) -> None:
    """Send the signal and wait until the kernel shows its effect (gone, or stopped)."""
    from tandem.backends.processes import read_process

    os.kill(process.pid, sig)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = read_process(process.pid)
        if now is None or not now.alive or (sig == signal.SIGSTOP and now.stopped):
            return
        time.sleep(0.005)


def still_there(process) -> bool:
    from tandem.backends.processes import read_process

    now = read_process(process.pid)
    return now is not None and now.alive and now.start_ticks == process.start_ticks


async def in_flight(client: httpx.AsyncClient, endpoint: str) -> tuple[int | None, float]:
    """running + waiting at a group's leader, and its finished requests so far."""
    try:
        text = (await client.get(endpoint + "/metrics", timeout=5)).text
    except httpx.HTTPError:
        return None, 0.0
    running = waiting = finished = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            running += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:num_requests_waiting{"):
            waiting += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:request_success_total{"):
            finished += float(line.rsplit(" ", 1)[1])
    return int(running + waiting), finished


# ---------------------------------------------------------------------------------- scenario


async def client_loop(
    client: httpx.AsyncClient, records: list[Request], stop: asyncio.Event, t0: float
) -> None:
    while not stop.is_set():
        prompt = f"{random.randrange(10**9)}: write two sentences about {random.choice(TOPICS)}."
        record = Request(start=time.monotonic() - t0)
        records.append(record)
        try:
            response = await client.post(
                ROUTER + "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 32,
                    "temperature": 0.7,
                },
            )
            record.status = response.status_code
            record.ok = response.status_code == 200 and bool(response.json().get("choices"))
            if not record.ok:
                record.error = f"HTTP {response.status_code}: {response.text[:120]}"
        except (httpx.HTTPError, ValueError) as exc:
            record.error = f"{type(exc).__name__}: {str(exc)[:120]}"
        record.end = time.monotonic() - t0


def events_since(path: Path, offset: int) -> list[str]:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def scenario(
    mode: str, kind: str, env: dict[str, str], home: Path, args: argparse.Namespace
) -> Scenario:
    """One mode and fault kind: the fleet ready, a supervisor of its own, the load and the
    fault (``under_load``), then the supervisor stopped and a stopped process never left."""
    result = Scenario(mode=mode, kind=kind)
    result.notes += wait_ready(env, home)
    g1 = group_endpoint(home, GROUPS[1])
    events = home / "deployments" / NAME / "events.log"  # group 1's lines: "group 1: ..."
    offset = events.stat().st_size if events.exists() else 0
    supervisor = subprocess.Popen(
        [
            *TANDEM,
            "supervise",
            NAME,
            "--interval",
            "1",
            "--backoff",
            "2",
            "--canary-interval",
            "2",
            MODES[mode],
        ],
        env=env,
        stdout=(home / f"supervise-{mode}-{kind}.out").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    touched: list = []
    try:
        deadline = time.monotonic() + 60
        while not any("supervising" in line for line in events_since(events, offset)):
            if time.monotonic() > deadline or supervisor.poll() is not None:
                raise SystemExit(f"the supervisor of {GROUPS[1]} did not start")
            time.sleep(0.2)
        asyncio.run(under_load(result, home, events, offset, args, touched))
        if not settled(result):
            late(result, home, g1, events, offset)
    finally:
        waited = time.monotonic()
        while restart_running(events, offset) and supervisor.poll() is None:
            if time.monotonic() - waited > 480:
                result.notes.append("a restart still ran 480 s after the window: stopped")
                break
            time.sleep(1)
        if time.monotonic() - waited > 1:
            result.notes.append(
                f"a restart of group 1 ran when the window ended: waited "
                f"{time.monotonic() - waited:.0f} s for it before stopping the supervisor"
            )
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=180)
        except subprocess.TimeoutExpired:
            result.notes.append("the supervisor did not stop in 180 s of SIGTERM: SIGKILL")
            supervisor.kill()
            supervisor.wait()
        result.events = events_since(events, offset)
        for target in touched:
            if KINDS[kind][1] == signal.SIGSTOP and still_there(target):
                result.notes.append(
                    f"the stopped {target.name} (pid {target.pid}) outlived the scenario: "
                    "SIGCONT and SIGKILL by the benchmark"
                )
                os.kill(target.pid, signal.SIGCONT)
                os.kill(target.pid, signal.SIGKILL)
    return result


def restart_running(events: Path, offset: int) -> bool:
    """A restart of group 1 begun and neither done nor failed (stopping its supervisor now
    would stop the group)."""
    lines = events_since(events, offset)
    begun = sum(1 for line in lines if re.search(r"restart \d+/\d+ in ", line))
    ended = sum(1 for line in lines if re.search(r"restart \d+ (done|failed)", line))
    return begun > ended


def leader_now(home: Path) -> str:
    """Group 1's leader as /proc shows it and the size of its log: evidence for a slow start."""
    from tandem.backends.processes import read_process

    try:
        rank = group_record(home, GROUPS[1])["ranks"][0]
    except (OSError, ValueError, KeyError, IndexError, StopIteration):
        return "no state of group 1"
    process = read_process(rank["pid"]) if rank.get("pid") else None
    try:
        size = Path(rank["log"]).stat().st_size
    except OSError:
        size = -1
    if process is None:
        return f"leader pid {rank.get('pid')} gone, log {size} bytes"
    return (
        f"leader pid {process.pid} state {process.state}, {process.cpu_s:.1f} s CPU, "
        f"log {size} bytes"
    )


def settled(result: Scenario) -> bool:
    """Group 1 back in rotation, or (never out of it) answering again at its leader."""
    return (
        result.rejoin_s is not None
        if result.leave_s is not None
        else (result.answers_again_s is not None)
    )


def late(
    result: Scenario, home: Path, g1: str, events: Path, offset: int, timeout_s: float = 480
) -> None:
    """The window ended before group 1 came back: keep its supervisor running (stopping it
    mid-restart would stop the group) until it does, and record the late times."""
    result.notes.append(
        "group 1 not back when the window ended: waited for it after the load; then: "
        + leader_now(home)
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not settled(result):
        since = round(time.monotonic() - result.fault_monotonic, 2)
        if result.answers_again_s is None and any(
            "done:" in line and "answers again" in line for line in events_since(events, offset)
        ):
            result.answers_again_s = since
        try:
            if result.leave_s is not None and workers().get(g1):
                result.rejoin_s = since
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    if not settled(result):
        result.notes.append(f"group 1 still not back {timeout_s:.0f} s after the window")


async def under_load(
    result: Scenario,
    home: Path,
    events: Path,
    offset: int,
    args: argparse.Namespace,
    touched: list,
) -> None:
    """The load through the router, the fault after the warm-up, the router's members polled
    until group 1 is back (or the cap); fills ``result``."""
    g0, g1 = group_endpoint(home, GROUPS[0]), group_endpoint(home, GROUPS[1])
    kind = result.kind
    records: list[Request] = []
    stop = asyncio.Event()
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with (
        httpx.AsyncClient(timeout=args.request_timeout, limits=limits, headers=headers) as c,
        httpx.AsyncClient(timeout=2) as poller,
    ):
        loops = [
            asyncio.create_task(client_loop(c, records, stop, t0)) for _ in range(args.concurrency)
        ]
        _, g0_before = await in_flight(poller, g0)
        _, g1_before = await in_flight(poller, g1)
        await asyncio.sleep(args.warmup)
        result.in_flight_g1, g1_done = await in_flight(poller, g1)
        _, g0_done = await in_flight(poller, g0)
        served = (g0_done - g0_before) + (g1_done - g1_before)
        if served:
            result.warmup_share_g1 = round((g1_done - g1_before) / served, 2)
        target = find_target(home, KINDS[kind][0])
        touched.append(target)
        await asyncio.to_thread(inject, target, KINDS[kind][1])
        fault = time.monotonic() - t0
        result.target = f"{KINDS[kind][1].name} {target.name} pid {target.pid}"
        result.in_flight_client = sum(1 for r in records if r.start <= fault and not r.end)
        print(f"  {result.mode}/{kind}: {result.target} at {fault:.1f} s", flush=True)
        out_at = back_at = again_at = None
        last: tuple | None = None
        while True:
            now = time.monotonic() - t0
            try:
                body = (await poller.get(ROUTER + "/workers")).json()
                members = {w["url"]: bool(w["is_healthy"]) for w in body["workers"]}
                seen: tuple = (g1 in members, members.get(g1, False))
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                seen = ("error", type(exc).__name__)
            if seen != last:
                result.membership.append([round(now - fault, 2), *seen])
                last = seen
            serving = seen == (True, True)
            if out_at is None and not serving and seen[0] != "error":
                out_at = now
                result.leave_how = "removed" if not seen[0] else "marked unhealthy"
            elif out_at is not None and back_at is None and serving:
                back_at = now
            if again_at is None and any(
                "done:" in line and "answers again" in line for line in events_since(events, offset)
            ):
                again_at = now
            settled = back_at if out_at is not None else again_at
            if settled is not None and now - settled >= args.tail:
                break
            if now - fault >= args.max_after:
                result.notes.append(f"window capped {args.max_after:.0f} s after the fault")
                break
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*loops)
        end = time.monotonic() - t0
    result.window_s = round(end, 1)
    result.leave_s = round(out_at - fault, 2) if out_at is not None else None
    result.rejoin_s = round(back_at - fault, 2) if back_at is not None else None
    result.answers_again_s = round(again_at - fault, 2) if again_at is not None else None
    failed = [r for r in records if not r.ok]
    result.requests, result.failed = len(records), len(failed)
    result.failed_before_fault = sum(1 for r in failed if r.end and r.end < fault)
    result.failed_started_after_fault = sum(1 for r in failed if r.start > fault)
    result.failed_beyond_in_flight = max(0, len(failed) - (result.in_flight_g1 or 0))
    for r in failed:
        kind_of_error = r.error.split(":", 1)[0] if r.error else "no answer"
        result.errors[kind_of_error] = result.errors.get(kind_of_error, 0) + 1
    result.requests_detail = [asdict(r) for r in records]
    result.fault_at = round(fault, 3)
    result.fault_monotonic = t0 + fault


# ---------------------------------------------------------------------------------- report


def fmt(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "never"
    return f"{value:.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def table(results: list[Scenario]) -> str:
    rows = [
        "| mode | fault | requests | failed | in flight on g1 at kill | failed beyond in flight "
        "| failed, sent after kill | leave rotation s | rejoin s | g1 answers again s "
        "| window s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        leave = fmt(r.leave_s) + (f" ({r.leave_how})" if r.leave_how else "")
        rows.append(
            f"| {r.mode} | {r.kind} | {r.requests} | {r.failed} | {fmt(r.in_flight_g1)} | "
            f"{r.failed_beyond_in_flight} | {r.failed_started_after_fault} | {leave} | "
            f"{fmt(r.rejoin_s) if r.leave_s is not None else 'n/a'} | "
            f"{fmt(r.answers_again_s)} | {r.window_s:.1f} |"
        )
    return "\n".join(rows)


def details(results: list[Scenario]) -> str:
    lines = []
    for r in results:
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(r.errors.items())) or "none"
        lines.append(
            f"- {r.mode}/{r.kind}: {r.target}; client requests outstanding at the kill "
            f"{r.in_flight_client}; group 1's share of the warm-up {r.warmup_share_g1}; "
            f"errors: {errors}"
            + (
                f"; failed before the fault: {r.failed_before_fault}"
                if r.failed_before_fault
                else ""
            )
            + ("".join(f"; NOTE {n}" for n in r.notes))
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- main


def tree() -> str:
    """The commit the run measures, and whether src/ differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    dirty = subprocess.run(["git", "status", "--short", "src"], cwd=ROOT, capture_output=True)
    return head.stdout.decode().strip() + (" (src/ modified)" if dirty.stdout.strip() else "")


def fleet_env(home: Path | None, hf_home: Path, prefix: str) -> tuple[Path, dict[str, str]]:
    """The fleet's ``TANDEM_HOME`` (a new temp folder unless given) and the environment every
    tandem command of the run gets (this process's too: the fault code reads the state)."""
    home = home or Path(tempfile.mkdtemp(prefix=prefix))
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HOME": str(hf_home), "TANDEM_HOME": str(home), "VLLM_API_KEY": API_KEY}
    os.environ.update(env)
    return home, env


def boot(home: Path, hf_home: Path, env: dict[str, str]) -> float | None:
    """``tandem up`` of the fleet in ``home`` (the real model built into ``hf_home`` first),
    unless one is already up there; the seconds it took, or None when reused."""
    if (home / "deployments" / NAME / "state.json").exists():
        return None
    started = time.monotonic()
    if not (hf_home / "hub").is_dir():
        tandem("model", "real", "--hf-home", str(hf_home), env=env, check=True)
    (home / "recipe.yaml").write_text(recipe_text())
    (home / "cluster.yaml").write_text(CLUSTER)
    up = tandem("up", str(home / "recipe.yaml"), "--cluster", str(home / "cluster.yaml"), env=env)
    if up.returncode:
        tandem("down", NAME, env=env, timeout=300)
        raise SystemExit(f"up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    took = round(time.monotonic() - started, 1)
    print(f"fleet up in {took} s", flush=True)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=20.0, help="Load before the fault, s.")
    parser.add_argument("--tail", type=float, default=10.0, help="Load after the rejoin, s.")
    parser.add_argument("--max-after", type=float, default=200.0, help="Cap after the fault, s.")
    parser.add_argument("--request-timeout", type=float, default=30.0)
    parser.add_argument("--hf-home", type=Path, default=Path(tempfile.gettempdir()) / "tandem-hf")
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="TANDEM_HOME (default: a temp folder); a fleet already up there is reused",
    )
    parser.add_argument("--keep", action="store_true", help="Leave the fleet up at the end.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    modes = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(kinds) - set(KINDS)) + sorted(set(modes) - set(MODES)):
        parser.error(f"unknown {unknown}; kinds: {', '.join(KINDS)}; modes: {', '.join(MODES)}")
    home, env = fleet_env(args.home, args.hf_home, "tandem-rfaults-")
    started = time.monotonic()
    extra: dict = {"home": str(home), "boot_s": None, "tree": tree()}
    print(f"tandem at {extra['tree']}", flush=True)
    extra["boot_s"] = boot(home, args.hf_home, env)
    results: list[Scenario] = []
    try:
        for mode in modes:
            for kind in kinds:
                results.append(scenario(mode, kind, env, home, args))
                print(table(results[-1:]).splitlines()[-1], flush=True)
    finally:
        if not args.keep:
            down = tandem("down", NAME, env=env, timeout=300)
            extra["down_rc"] = down.returncode
            extra["down_output"] = down.stdout[-2000:] + down.stderr[-1000:]
            extra["leftovers"] = leftovers()
        extra["wall_s"] = round(time.monotonic() - started, 1)
        print()
        print(table(results))
        print()
        print(details(results))
        if "down_rc" in extra:
            print(
                f"\n`tandem down {NAME}` exit {extra['down_rc']}, left behind: "
                f"{', '.join(extra['leftovers']) or 'nothing'}; wall {extra['wall_s']:.0f} s"
                + (f", first boot {extra['boot_s']} s" if extra["boot_s"] else "")
            )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "config": {k: str(v) for k, v in vars(args).items()},
                        "scenarios": [asdict(r) for r in results],
                        **extra,
                    },
                    indent=2,
                    default=str,
                )
            )
    ok = all(r.failed_beyond_in_flight == 0 for r in results if r.mode == "tandem")
    return 0 if ok and not extra.get("leftovers") and extra.get("down_rc", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
