"""The sources of a sample other than GPUs: /metrics, events.log, /proc and sysfs."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from tandem import agent, wire
from tandem.watch.events import EventReader, parse_event
from tandem.watch.leader import parse_leader_metrics

BENCH = Path(__file__).resolve().parent.parent / "fixtures" / "bench"


def test_the_leaders_metrics_recorded_from_vllm_cpu():
    """metrics_after.txt: two requests of 8 tokens each finished with reason `length`."""
    reading = parse_leader_metrics((BENCH / "metrics_after.txt").read_text(), 0.01)
    assert reading.generation_tokens == 16 and reading.prompt_tokens == 28
    assert reading.finished == {"stop": 0, "length": 2, "abort": 0, "error": 0, "repetition": 0}
    assert reading.requests_running == 0 and reading.requests_waiting == 0
    assert reading.kv_cache_usage is not None and 0 <= reading.kv_cache_usage <= 1
    assert reading.preemptions == 0 and reading.spec_drafts is None  # no speculative decoding


def test_events_log_restarts_are_counted_and_only_new_lines_returned(tmp_path):
    """The lines are the ones tandem.backends.supervisor writes."""
    log = tmp_path / "events.log"
    log.write_text(
        "2026-12-01T08:00:00Z  supervising 'x': every 5 s\n"
        "2026-12-01T08:10:00Z  group broken: rank 1 (worker on n2) is not running\n"
        "2026-12-01T08:10:00Z  restart 1/3 in 10 s: stopping every rank, then ...\n"
    )
    reader = EventReader("x", since=datetime(2026, 12, 1, 8, 5, tzinfo=UTC), path=log)
    new, restarts = reader.read()
    assert restarts == 1 and [e.restart for e in new] == [False, True]
    with log.open("a") as handle:
        handle.write(
            "2026-12-01T08:11:00Z  restart 1 done: http://h:8000 answers again\n"
            "2026-12-01T08:20:00Z  restart 2/3 in 20 s: stop"
        )  # torn last line
    new, restarts = reader.read()
    assert restarts == 1 and [e.text[:9] for e in new] == ["restart 1"]
    assert parse_event("no timestamp here") is None


def test_this_hosts_proc_gives_memory_and_a_marked_process(tmp_path):
    """A real child process marked as rank 3 of a deployment is found with its RSS and CPU."""
    env = {**os.environ, agent.MARK_DEPLOYMENT: "watch-test", agent.MARK_RANK: "3"}
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print(flush=True); time.sleep(30)"],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        child.stdout.readline()  # an interpreter, not the fork before exec (16 KiB on a busy box)
        raw = agent.look({"deployment": "watch-test", "node": True}, agent.Node())
    finally:
        child.kill()
        child.wait()
    node = raw["node"]
    assert node["meminfo"]["MemTotal"] > node["meminfo"]["MemAvailable"] > 0
    [process] = raw["ranks"]["3"]
    assert process["pid"] == child.pid and process["state"] in ("R", "S")
    assert process["rss_bytes"] > 1024**2 and process["name"].startswith("python")
    assert node["oom_kills"] is None or node["oom_kills"] >= 0


def test_the_agents_marks_are_the_names_tandem_sets():
    """The agent runs where tandem is not installed, so it spells the marks itself."""
    assert (agent.MARK_DEPLOYMENT, agent.MARK_RANK, agent.MARK_LAUNCH) == (
        wire.TANDEM_DEPLOYMENT,
        wire.TANDEM_RANK,
        wire.TANDEM_LAUNCH,
    )


def test_rdma_port_counters_from_a_sysfs_tree(tmp_path):
    """The layout of /sys/class/infiniband (the kernel's Documentation/ABI/stable/
    sysfs-class-infiniband)."""
    port = tmp_path / "sys" / "class" / "infiniband" / "rocep1s0f1" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "counters" / "port_xmit_data").write_text("1000\n")
    (port / "counters" / "port_rcv_data").write_text("250\n")
    [found] = agent.rdma_counters(agent.Node(root=str(tmp_path)))
    assert found["device"] == "rocep1s0f1" and found["state"] == "4: ACTIVE"
    assert found["port_xmit_data"] == 1000 and found["symbol_error"] is None
    assert agent.rdma_counters(agent.Node(root=str(tmp_path / "none"))) == []
