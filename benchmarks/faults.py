"""Faults against a real 2-rank vLLM-CPU deployment: time to detect, time to answer again.

For each fault kind the script waits until the deployment is healthy, injects the fault into
one process (or namespace) of one rank, then polls ``tandem.operations.lifecycle.status`` (the
health model) every 0.5 s until the verdict is no longer ``healthy`` — time to detect — and then
until it is healthy again and a chat completion answers, which ``tandem supervise`` (running beside
it) brings about by restarting the whole group — time to answer again. At the end ``tandem down``
must leave no marked process, namespace, veth or bridge.

Usage (as root, from the project root, after `make install`):

    .venv/bin/python benchmarks/faults.py                     # every kind, a table
    .venv/bin/python benchmarks/faults.py --kinds worker-stop,worker-main --json out.json
    .venv/bin/python benchmarks/faults.py --attach tiny-local   # a running 2-rank deployment

With ``--attach NAME`` the faults go into a deployment that already runs under ``TANDEM_HOME``
(its key from ``VLLM_API_KEY``) and it is left running, healthy, with no supervisor: the test
suite uses its shared deployment so, saving a boot, and checks what ``down`` leaves at its end.

The kinds: SIGKILL of each process kind of each rank (leader main, engine, worker; worker main,
worker), SIGSTOP of the worker's worker process (a hang), and deletion of the worker's network
namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TANDEM = [sys.executable, "-m", "tandem.cli"]
NAME = "faults"
API_KEY = "faults-key"

CLUSTER = """\
name: faults
transport: local
local: {isolation: netns, subnet: 10.81.0.0/24}
nodes:
  - {name: node0, address: 10.81.0.1, control_plane_interface: tdm0,
     env: {VLLM_CPU_OMP_THREADS_BIND: "0"}}
  - {name: node1, address: 10.81.0.2, control_plane_interface: tdm1,
     env: {VLLM_CPU_OMP_THREADS_BIND: "1"}}
"""

# kind -> (rank, process name prefix or "netns", signal, verdicts that are right)
KINDS: dict[str, tuple[int, str, int | None, tuple[str, ...]]] = {
    "leader-main": (0, "vllm", signal.SIGKILL, ("down", "degraded")),
    "leader-engine": (0, "VLLM::EngineCor", signal.SIGKILL, ("degraded", "down")),
    "leader-worker": (0, "VLLM::Worker", signal.SIGKILL, ("degraded", "down")),
    "worker-main": (1, "vllm", signal.SIGKILL, ("degraded",)),
    "worker-worker": (1, "VLLM::Worker", signal.SIGKILL, ("degraded",)),
    "worker-stop": (1, "VLLM::Worker", signal.SIGSTOP, ("stalled",)),
    "worker-netns": (1, "netns", None, ("degraded",)),
}


@dataclass
class Outcome:
    kind: str
    target: str
    verdict: str
    rank: int | None
    right: bool
    detect_s: float | None
    answer_again_s: float | None
    reason: str
    restart_logs_kept: bool


def recipe_text() -> str:
    text = (ROOT / "src/tandem/recipes/tiny-local.yaml").read_text()
    return text.replace("name: tiny-local", f"name: {NAME}", 1)


def status(name: str):
    from tandem.operations.lifecycle import status as read_status

    return read_status(name, canary_timeout_s=5)


def wait_healthy(name: str, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            report = status(name)
            if report.verdict.value == "healthy" and chat_answers(report.endpoint, report.model):
                return time.monotonic() - started
        except Exception:  # noqa: BLE001 - state rewritten mid-restart; look again
            pass
        time.sleep(0.5)
    raise SystemExit(f"not healthy within {timeout_s:.0f} s")


def chat_answers(endpoint: str, model: str) -> bool:
    try:
        response = httpx.post(
            f"{endpoint}/v1/chat/completions",
            timeout=30,
            headers={"Authorization": f"Bearer {os.environ.get('VLLM_API_KEY', '')}"},
            json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def inject(kind: str, state_dir: Path) -> str:
    rank, what, sig, _ = KINDS[kind]
    state = json.loads((state_dir / "state.json").read_text())
    record = next(r for g in state["groups"] for r in g["ranks"] if r["rank"] == rank)
    if what == "netns":
        subprocess.run(["ip", "netns", "del", record["netns"]], check=True)
        return f"ip netns del {record['netns']}"
    process = next(p for p in record["processes"] if p["name"].startswith(what))
    os.kill(process["pid"], sig)
    took_effect(process["pid"], sig)
    return f"{signal.Signals(sig).name} {process['name']} {process['pid']} (rank {rank})"


def took_effect(pid: int, sig: int, timeout_s: float = 5.0) -> None:
    """Wait until the kernel shows the signal's effect (gone, or stopped): the fault's moment.

    A look in the microseconds between kill() and the process's death sees it alive, and a
    canary sent then crashes the leader for the wrong reason.
    """
    from tandem.backends.processes import read_process

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        process = read_process(pid)
        if process is None or not process.alive or (sig == signal.SIGSTOP and process.stopped):
            return
        time.sleep(0.01)


def restart_folders(state_dir: Path) -> int:
    return len(list((state_dir / "logs").glob("restart-*")))


def leftovers(cluster: Path) -> list[str]:
    from tandem.backends.processes import marked_processes

    found = [f"process {pid}" for pid in marked_processes(NAME)]
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [line.split()[0] for line in namespaces.splitlines() if f"tdm-{NAME}-" in line]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    from tandem.backends.netns import network_plan
    from tandem.spec.loading import load_cluster

    plan = network_plan(NAME, load_cluster(cluster))
    found += [d for d in [plan.bridge, *(n.host_end for n in plan.nodes)] if f" {d}" in links]
    return found


def boot(hf_home: Path, home: Path) -> tuple[Path, float]:
    """The faults deployment, up on its own subnet: its cluster file and the boot's seconds."""
    os.environ.update({"HF_HOME": str(hf_home), "TANDEM_HOME": str(home), "VLLM_API_KEY": API_KEY})
    subprocess.run(
        [*TANDEM, "model", "tiny", "--hf-home", str(hf_home)], check=True, capture_output=True
    )
    recipe, cluster = home / "faults.yaml", home / "cluster.yaml"
    home.mkdir(parents=True, exist_ok=True)
    recipe.write_text(recipe_text())
    cluster.write_text(CLUSTER)
    started = time.monotonic()
    up = subprocess.run(
        [*TANDEM, "up", str(recipe), "--cluster", str(cluster), "--skip-checks"],
        capture_output=True,
        text=True,
    )
    if up.returncode:
        raise SystemExit(f"up failed:\n{up.stdout}\n{up.stderr}")
    return cluster, time.monotonic() - started


def inject_all(name: str, kinds: list[str], home: Path) -> tuple[list[Outcome], subprocess.Popen]:
    """Each fault into deployment ``name`` under a supervisor started here (returned running)."""
    state_dir = home / "deployments" / name
    supervisor = subprocess.Popen(
        [
            *TANDEM,
            "supervise",
            name,
            "--interval",
            "1",
            "--backoff",
            "1",
            "--max-restarts",
            str(len(kinds) + 2),
            "--canary-interval",
            "5",
        ],
        stdout=(home / f"supervise-{name}.out").open("w"),
        stderr=subprocess.STDOUT,
    )
    outcomes = []
    try:
        for kind in kinds:
            wait_healthy(name, 600)
            before = restart_folders(state_dir)
            target = inject(kind, state_dir)
            injected = time.monotonic()
            verdict, rank, reason, detect_s = "healthy", None, "", None
            while time.monotonic() - injected < 60:
                try:
                    report = status(name)
                except Exception:  # noqa: BLE001 - the supervisor may be rewriting the state
                    time.sleep(0.2)
                    continue
                if report.verdict.value != "healthy":
                    verdict, rank, reason = report.verdict.value, report.rank, report.reason
                    detect_s = time.monotonic() - injected
                    break
                time.sleep(0.5)
            wait_healthy(name, 900)
            answer_again_s = time.monotonic() - injected
            right = verdict in KINDS[kind][3] and rank == KINDS[kind][0]
            outcomes.append(
                Outcome(
                    kind,
                    target,
                    verdict,
                    rank,
                    right,
                    detect_s,
                    answer_again_s,
                    reason,
                    restart_folders(state_dir) > before,
                )
            )
            print(
                f"{kind:14} {verdict:9} rank {rank} detect {detect_s} s, "
                f"answers again after {answer_again_s:.1f} s: {reason}",
                flush=True,
            )
    except BaseException:
        supervisor.terminate()
        supervisor.wait(timeout=120)
        raise
    return outcomes, supervisor


def run(kinds: list[str], hf_home: Path, home: Path) -> tuple[list[Outcome], dict]:
    """Boot the faults deployment, inject every kind, then ``down`` and look for leftovers."""
    cluster, boot_s = boot(hf_home, home)
    outcomes: list[Outcome] = []
    try:
        outcomes, supervisor = inject_all(NAME, kinds, home)
    finally:
        down = subprocess.run([*TANDEM, "down", NAME], capture_output=True, text=True)
    supervisor.wait(timeout=120)
    left = leftovers(cluster)
    return outcomes, {
        "boot_s": boot_s,
        "down_rc": down.returncode,
        "leftovers": left,
        "down_output": down.stdout[-2000:],
    }


def attach(name: str, kinds: list[str]) -> tuple[list[Outcome], dict]:
    """Inject every kind into the running deployment ``name``; stop the supervisor, keep it."""
    home = Path(os.environ.get("TANDEM_HOME", Path.home() / ".tandem"))
    outcomes, supervisor = inject_all(name, kinds, home)
    supervisor.terminate()
    supervisor.wait(timeout=120)
    return outcomes, {"boot_s": None, "down_rc": None, "leftovers": None, "down_output": ""}


def table(outcomes: list[Outcome], extra: dict) -> str:
    rows = [
        "| fault | injected | verdict | rank | right | detect s | answers again s | "
        "logs kept | reason |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        detect = f"{o.detect_s:.1f}" if o.detect_s is not None else "not seen in 60 s"
        rows.append(
            f"| {o.kind} | {o.target} | {o.verdict} | {o.rank} | "
            f"{'yes' if o.right else 'NO'} | {detect} | {o.answer_again_s:.1f} | "
            f"{'yes' if o.restart_logs_kept else 'no'} | {o.reason} |"
        )
    rows.append("")
    if extra["boot_s"] is not None:
        rows.append(
            f"first boot {extra['boot_s']:.1f} s; `tandem down` exit {extra['down_rc']}, "
            f"left behind: {', '.join(extra['leftovers']) or 'nothing'}"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--hf-home", type=Path, default=Path(tempfile.gettempdir()) / "tandem-hf")
    parser.add_argument(
        "--home", type=Path, default=None, help="TANDEM_HOME (default: a temp folder)"
    )
    parser.add_argument("--json", type=Path, default=None, help="Also write the outcomes here.")
    parser.add_argument(
        "--attach", metavar="NAME", help="Fault a deployment already running; leave it running."
    )
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
    if args.attach:
        outcomes, extra = attach(args.attach, kinds)
    else:
        home = args.home or Path(tempfile.mkdtemp(prefix="tandem-faults-"))
        outcomes, extra = run(kinds, args.hf_home, home)
    print(table(outcomes, extra))
    if args.json:
        args.json.write_text(
            json.dumps({"outcomes": [asdict(o) for o in outcomes], **extra}, indent=2)
        )
    ok = all(o.right and o.detect_s is not None and o.detect_s <= 10 for o in outcomes)
    clean = args.attach or (not extra["leftovers"] and extra["down_rc"] == 0)
    return 0 if ok and clean else 1


if __name__ == "__main__":
    sys.exit(main())
