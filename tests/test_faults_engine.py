"""Faults in a real 2-rank deployment: the verdict and the rank within 10 s, and supervise.

A SIGSTOP of the worker's worker process is undone, so it runs with the shared deployment's
other tests; the destructive faults run through ``benchmarks/faults.py --attach`` on the same
deployment once nothing else needs it whole, with ``tandem supervise`` beside it: every one must
be detected in time, named right and restarted with the crashed group's logs kept, and the
deployment answers again; the session's last test then checks that ``down`` leaves nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).parents[1]


def status(deployment) -> tuple[int, dict]:
    result = deployment.tandem("status", "--json", check=False)
    return result.returncode, json.loads(result.stdout)


def wait_for(deployment, verdict: str, timeout_s: float) -> tuple[float, int, dict]:
    started = time.monotonic()
    while True:
        code, report = status(deployment)
        if report["verdict"] == verdict:
            return time.monotonic() - started, code, report
        assert time.monotonic() - started < timeout_s, report
        time.sleep(0.3)


def test_a_stopped_worker_is_stalled_within_10_s_and_healthy_again(tiny_deployment):
    state = json.loads((tiny_deployment.state_dir / "state.json").read_text())
    worker = next(r for r in state["groups"][0]["ranks"] if r["rank"] == 1)
    pid = next(p["pid"] for p in worker["processes"] if p["name"].startswith("VLLM::Worker"))
    os.kill(pid, signal.SIGSTOP)
    try:
        _took, code, report = wait_for(tiny_deployment, "stalled", 10)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert code == 5 and report["rank"] == 1 and f"pid {pid}" in report["reason"]
    assert report["ranks"][1]["health"]["state"] == "stalled"
    assert report["ranks"][1]["health"]["evidence"] == f"/proc/{pid}/stat state T"
    _, code, report = wait_for(tiny_deployment, "healthy", 30)
    assert code == 0 and report["healthy"] is True


@pytest.mark.netns
@pytest.mark.breaks_deployment
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_killed_processes_and_a_deleted_namespace_under_supervise(tiny_deployment, tmp_path):
    """On the shared deployment, once every test that needs it whole has run (a boot saved);
    what ``down`` leaves after these restarts is looked at by ``test_local_engine``'s last test."""
    out = tmp_path / "faults.json"
    kinds = "worker-main,leader-engine,worker-netns"
    events_log = tiny_deployment.state_dir / "events.log"
    seen = events_log.stat().st_size if events_log.exists() else 0
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/faults.py"),
            "--kinds",
            kinds,
            "--attach",
            tiny_deployment.name,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=2400,
        env=tiny_deployment.env,
    )
    assert out.exists(), run.stdout + run.stderr
    result = json.loads(out.read_text())
    for outcome in result["outcomes"]:
        assert outcome["right"], outcome
        assert outcome["detect_s"] is not None and outcome["detect_s"] <= 10, outcome
        assert outcome["restart_logs_kept"], outcome
    assert [o["kind"] for o in result["outcomes"]] == kinds.split(",")
    events = events_log.read_bytes()[seen:].decode()
    assert events.count("group broken:") == 3 and "answers again" in events
    assert "[evidence:" in events
    assert run.returncode == 0, run.stdout + run.stderr
    status = json.loads(tiny_deployment.tandem("status", "--json").stdout)
    assert status["verdict"] == "healthy"
