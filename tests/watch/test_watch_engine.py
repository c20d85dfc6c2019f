"""tandem watch against the real 2-rank vLLM-CPU deployment (the shared session fixture).

One watch of at least 60 s under bench load (``bench --watch``'s own telemetry runs beside
it), killed with SIGKILL half-way and resumed into the same folder; the report judges it. The
Prometheus test scrapes the deployment through the rendered config and kills a rank, so it
runs after every test that needs the deployment whole (``breaks_deployment``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import yaml
from ports import free_port
from tandem_cli import spawn_tandem
from waiting import NOT_YET, until

from tandem.backends.local import LocalBackend
from tandem.backends.processes import marked_processes
from tandem.operations import lifecycle
from tandem.watch.folder import read_samples
from tandem.watch.sampler import Watcher

pytestmark = pytest.mark.engine

GIB = 1024**3


def _report(deployment, folder: Path, *flags: str) -> tuple[int, dict]:
    done = deployment.tandem("watch", "report", str(folder), "--json", *flags, check=False)
    return done.returncode, json.loads(done.stdout)


def _check(summary: dict, prefix: str) -> list[dict]:
    return [c for c in summary["checks"] if c["name"].startswith(prefix)]


def test_a_watch_under_load_killed_and_resumed_is_reported(tiny_deployment, tmp_path):
    out, bench_out = tmp_path / "watch", tmp_path / "bench"
    watch = spawn_tandem(
        tiny_deployment.env,
        "watch",
        "tiny-local",
        "--interval",
        "5s",
        "--duration",
        "65s",
        "--out",
        str(out),
        "--quiet",
    )
    load = spawn_tandem(
        tiny_deployment.env,
        "bench",
        "tiny-local",
        "--watch",
        "--concurrency",
        "2",
        "--requests",
        "72",
        "--output-tokens",
        "48",
        "--warmup",
        "0",
        "--no-plots",
        "--quiet",
        "--out",
        str(bench_out),
    )  # ~60 s at the 40-60 tok/s of 2 cores
    try:
        time.sleep(32)
        watch.kill()  # SIGKILL: no chance to flush or clean up
        watch.wait(10)
        before = read_samples(out).records
        assert len(before) >= 5 and {s.segment for s in before} == {0}
        resumed = spawn_tandem(
            tiny_deployment.env, "watch", "tiny-local", "--out", str(out), "--quiet"
        )
        assert resumed.wait(90) == 0, resumed.stdout.read()
        assert load.wait(180) == 0, load.stdout.read()
    finally:
        if load.poll() is None:
            load.kill()
    samples = read_samples(out).records
    assert [s.seq for s in samples] == list(range(len(samples)))
    assert {s.segment for s in samples} == {0, 1}
    covered = sum(
        max(s.unix for s in samples if s.segment == k)
        - min(s.unix for s in samples if s.segment == k)
        for k in (0, 1)
    )
    assert covered >= 60 - 5
    assert all(s.verdict == "healthy" for s in samples)
    assert all(
        r.up and r.processes >= 1 and r.rss_bytes > 0
        for s in samples
        for n in s.nodes
        for r in n.ranks
    )
    assert [n.node for n in samples[-1].nodes] == ["node0", "node1"]
    generated = [s.leader.generation_tokens for s in samples if s.leader]
    assert len(generated) >= len(samples) - 1  # a scrape may time out on a loaded machine
    assert generated[-1] > generated[0]
    assert max(s.leader.requests_running for s in samples if s.leader) >= 1

    used = max(n.mem_used_bytes for s in samples for n in s.nodes) / GIB
    rc, summary = _report(tiny_deployment, out, "--max-memory-used-gib", f"{used * 0.5:.2f}")
    assert rc == 1 and {c["result"] for c in _check(summary, "memory used")} == {"FAIL"}
    rc, summary = _report(tiny_deployment, out, "--max-memory-used-gib", f"{used * 2:.2f}")
    assert {c["result"] for c in _check(summary, "memory used")} == {"PASS"}
    assert rc == (0 if summary["passed"] else 1)
    assert summary["segments"] == 2 and summary["generation_tokens"] > 0
    assert summary["restarts"] == 0 and summary["request_errors"] == 0
    assert _check(summary, "peak temperature")[0]["result"] == "SKIP"  # no GPU here
    for name in ("memory.png", "tokens.png", "load.png"):
        assert (out / name).stat().st_size > 10_000
    assert not (out / "gpu.png").exists()
    assert "| memory used node0 |" in (out / "report.md").read_text()

    # bench --watch: telemetry beside the results
    beside = read_samples(bench_out / "watch").records
    assert len(beside) >= 2
    assert beside[-1].leader.generation_tokens > beside[0].leader.generation_tokens
    assert (bench_out / "watch" / "report.md").is_file()


def test_eval_watch_records_the_telemetry_beside_the_responses(tiny_deployment, tmp_path):
    spec = importlib.util.spec_from_file_location(
        "gpqa_factory", Path(__file__).resolve().parent.parent / "eval" / "gpqa_factory.py"
    )
    factory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(factory)
    csv = factory.write_csv(tmp_path / "gpqa.csv", factory.make_rows(2))
    out = tmp_path / "eval"
    done = tiny_deployment.tandem(
        "eval",
        "gpqa",
        "tiny-local",
        "--csv",
        str(csv),
        "--out",
        str(out),
        "--max-tokens",
        "8",
        "--no-fallback",
        "--no-progress",
        "--watch",
        timeout=300,
    )
    assert "watch: PASS" in done.stdout or "watch: FAIL" in done.stdout
    samples = read_samples(out / "watch").records
    assert samples and samples[0].verdict == "healthy"
    assert (out / "watch" / "report.md").is_file() and (out / "responses.jsonl").is_file()


def _query(prometheus: str, expr: str) -> list[dict]:
    body = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=5).json()
    return body["data"]["result"]


def test_a_sample_asks_each_node_once_and_the_leader_once(tiny_deployment, tmp_path, monkeypatch):
    """Issue 27's one observation: every sample is one look at the nodes (one node-agent call
    a node; on this machine one scan of /proc serves both namespaces) and one /health and one
    /metrics at the leader, which the verdict and the sample's leader reading share. Counted
    on the real deployment, in this process."""
    for name in ("TANDEM_HOME", "HF_HOME", "VLLM_API_KEY"):
        monkeypatch.setenv(name, tiny_deployment.env[name])
    asked: dict[str, int] = {}

    def count(key: str) -> None:
        asked[key] = asked.get(key, 0) + 1

    send, iterdir = httpx.Client.send, Path.iterdir

    def counting_send(client, request, *args, **kwargs):
        count(request.url.path)
        return send(client, request, *args, **kwargs)

    def counting_iterdir(path):
        if str(path) == "/proc":
            count("/proc scan")
        return iterdir(path)

    class CountingBackend(LocalBackend):
        def observe(self, state, *, nodes=False):
            count(f"observe nodes={nodes}")
            return super().observe(state, nodes=nodes)

    monkeypatch.setattr(httpx.Client, "send", counting_send)
    monkeypatch.setattr(Path, "iterdir", counting_iterdir)
    out = tmp_path / "watch"
    Watcher("tiny-local", out, interval_s=0.5, duration_s=2.0, backend=CountingBackend()).run()
    samples = read_samples(out).records
    n = len(samples)
    assert n >= 3
    canaries = asked.pop("/v1/completions", 0)
    assert canaries <= 1  # at most one a minute
    assert asked == {
        "observe nodes=True": n,
        "/proc scan": n,
        "/health": n,
        "/metrics": n,
    }, f"{n} samples"
    for sample in samples:
        assert sample.verdict == "healthy" and sample.leader is not None
        assert sample.leader.generation_tokens is not None  # the verdict's scrape, parsed
        assert [node.error for node in sample.nodes] == [None, None]
        assert all(node.mem_total_bytes for node in sample.nodes)
        assert all(
            r.up and r.processes >= 2 and r.rss_bytes for n_ in sample.nodes for r in n_.ranks
        )


class _Opens:
    """Files this process opens while ``recording`` (an audit hook: added once, never removed)."""

    hooked = False
    recording = False
    paths: ClassVar[list[str]] = []

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if cls.recording and event == "open" and isinstance(args[0], str | Path):
            cls.paths.append(str(args[0]))


def test_status_plans_nothing_and_reads_no_weights(tiny_deployment, monkeypatch):
    """The plan was compared with the boot when `up` recorded it; a look opens no weight file
    and no model config (issue 27)."""
    for name in ("TANDEM_HOME", "HF_HOME", "VLLM_API_KEY"):
        monkeypatch.setenv(name, tiny_deployment.env[name])
    if not _Opens.hooked:
        sys.addaudithook(_Opens.hook)
        _Opens.hooked = True
    _Opens.paths.clear()
    _Opens.recording = True
    try:
        status = lifecycle.status("tiny-local")
    finally:
        _Opens.recording = False
    assert status.verdict == "healthy"
    assert status.planned.comparison is not None, status.planned.unavailable
    hf_home = tiny_deployment.env["HF_HOME"]
    assert [p for p in _Opens.paths if p.startswith(hf_home)] == []


@pytest.mark.breaks_deployment
def test_prometheus_scrapes_the_deployment_and_fires_when_a_rank_dies(tiny_deployment, tmp_path):
    metrics_port, web_port = free_port(), free_port()
    recipe = yaml.safe_load(
        resources.files("tandem.recipes").joinpath("tiny-local.yaml").read_text()
    )
    recipe["watch"] = {"interval_s": 2, "metrics_port": metrics_port}
    (tmp_path / "tiny-local.yaml").write_text(yaml.safe_dump(recipe))
    config = tmp_path / "prom"
    tiny_deployment.tandem(
        "render", str(tmp_path / "tiny-local.yaml"), "--target", "prometheus", "--out", str(config)
    )
    for kind, name in (("config", "prometheus.yml"), ("rules", "tandem-rules.yml")):
        checked = subprocess.run(
            ["promtool", "check", kind, str(config / name)], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
    watch = spawn_tandem(
        tiny_deployment.env,
        "watch",
        "tiny-local",
        "--interval",
        "2s",
        "--quiet",
        "--out",
        str(tmp_path / "watch"),
        "--serve-metrics",
        str(metrics_port),
        "--serve-address",
        "127.0.0.1",
    )
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    prometheus = f"http://127.0.0.1:{web_port}"
    try:
        until(
            "both targets up",
            lambda: (
                sorted(r["metric"]["job"] for r in _query(prometheus, "up == 1"))
                == ["tandem-watch", "vllm"]
            ),
            60,
            not_yet=NOT_YET,
        )
        until(
            "vLLM's own series",
            lambda: _query(prometheus, 'vllm:kv_cache_usage_perc{deployment="tiny-local"}'),
            30,
            not_yet=NOT_YET,
        )
        ranks = _query(prometheus, 'tandem_rank_up{deployment="tiny-local"}')
        assert sorted((r["metric"]["rank"], r["value"][1]) for r in ranks) == [
            ("0", "1"),
            ("1", "1"),
        ]

        rank1 = [pid for pid, rank in marked_processes("tiny-local").items() if rank == 1]
        assert rank1
        for pid in rank1:
            os.kill(pid, signal.SIGKILL)

        def firing() -> bool:
            alerts = httpx.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
            return any(
                a["labels"]["alertname"] == "TandemRankDown"
                and a["state"] == "firing"
                and a["labels"]["rank"] == "1"
                for a in alerts
            )

        until("TandemRankDown firing for rank 1", firing, 60, not_yet=NOT_YET)
        alerts = httpx.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        assert not [
            a
            for a in alerts
            if a["labels"]["alertname"] == "TandemRankDown" and a["labels"]["rank"] == "0"
        ]
    finally:
        server.terminate()
        watch.terminate()
        server.wait(30)
        watch.wait(30)
