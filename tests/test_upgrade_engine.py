"""``tandem upgrade``, ``rollback`` and ``history`` on the real engine: a deployment of its own
(``tiny-upgrade``, on its own subnet, beside the session's tiny-local), upgraded to bad
revisions (one that does not fit, a template that doubles BOS, two sequences at a time), each
refused or rolled back automatically to the revision before: it answers the same greedy tokens
as before, warm.

A good revision passing the gate at its default limits, its baseline and bench on seeds of
their own and the change ``history`` prints, is ``tests/test_answers_engine.py``'s benign
upgrade (the real model: the answers check judges there, where random weights cannot be
judged); the rolling upgrade of two groups is ``tests/test_fleet_engine.py``'s, and so is an
engine that does not start: its canary, the same upgrade of one group, is rolled back at the
start the same way (``upgrade`` is one roll whatever the number of groups)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from tandem_cli import run_tandem

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]
NAME = "tiny-upgrade"


def recipe(folder: Path, tag: str, *changes: tuple[str, str]) -> Path:
    """tiny-local as deployment tiny-upgrade, with each (old, new) text change made."""
    text = (ROOT / "src/tandem/recipes/tiny-local.yaml").read_text()
    text = text.replace("name: tiny-local", f"name: {NAME}")
    text = text.replace("description: ", f"description: {tag} ")
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    path = folder / f"{tag}.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def deployment(tiny_hf_home, tmp_path_factory):
    folder = tmp_path_factory.mktemp("upgrade")
    cluster = folder / "cluster.yaml"
    cluster.write_text(
        (ROOT / "examples/local-netns.yaml").read_text().replace("10.77.0.", "10.78.0.")
        if os.geteuid() == 0
        else "name: here\ntransport: local\nlocal: {isolation: loopback}\nnodes:\n"
        "  - {name: n0, address: 127.0.0.1}\n  - {name: n1, address: 127.0.0.1}\n"
    )
    env = {
        **os.environ,
        "HF_HOME": str(tiny_hf_home),
        "TANDEM_HOME": str(folder / "home"),
        "TANDEM_CLUSTER": str(cluster),
    }
    env.pop("VLLM_API_KEY", None)
    up = run_tandem("up", str(recipe(folder, "r1")), env=env, timeout=900, check=False)
    assert up.returncode == 0, up.stdout + up.stderr
    yield folder, env
    run_tandem("down", NAME, env=env, timeout=180, check=False)


def greedy(env: dict[str, str]) -> str:
    status = json.loads(run_tandem("status", NAME, "--json", env=env, check=False).stdout)
    body = {
        "model": status["model"],
        "messages": [{"role": "user", "content": "Name two planets."}],
        "max_tokens": 12,
        "temperature": 0,
    }
    answer = httpx.post(f"{status['endpoint']}/v1/chat/completions", json=body, timeout=120)
    return answer.json()["choices"][0]["message"]["content"]


def history(env: dict[str, str]) -> list[dict]:
    return json.loads(run_tandem("history", NAME, "--json", env=env).stdout)


def upgrade(env: dict[str, str], new: Path, *flags: str, timeout: int = 1500):
    """``tandem upgrade tiny-upgrade --recipe NEW FLAGS...``, its exit code left to the test."""
    return run_tandem(
        "upgrade", NAME, "--recipe", str(new), *flags, env=env, timeout=timeout, check=False
    )


def test_up_records_revision_one(deployment):
    _, env = deployment
    (first,) = history(env)
    assert first["number"] == 1 and first["outcome"] == "good"
    assert first["hosts"], "the preflight's host facts are recorded"


def test_a_revision_that_does_not_fit_is_refused_before_anything_stops(deployment):
    folder, env = deployment
    pid_before = json.loads(run_tandem("status", NAME, "--json", env=env).stdout)["ranks"][0]["pid"]
    huge = recipe(folder, "huge", ("max_model_len: 1024", "max_model_len: 999999999"))
    result = upgrade(env, huge, timeout=300)
    assert result.returncode == 1 and "nothing was stopped" in result.stderr, result.stderr
    status = json.loads(run_tandem("status", NAME, "--json", env=env).stdout)
    assert status["ranks"][0]["pid"] == pid_before and len(history(env)) == 1


def test_a_template_that_doubles_bos_fails_the_smoke_gate_and_is_rolled_back(
    deployment, tiny_hf_home
):
    """The break-on-purpose case of the template check, on the engine: the model's own chat
    template with one more BOS in front, given to vLLM with ``--chat-template``."""
    folder, env = deployment
    (own,) = (tiny_hf_home / "hub").glob(
        "models--*tiny-deepseek-v3/snapshots/*/chat_template.jinja"
    )
    doubled = folder / "doubled-bos.jinja"
    doubled.write_text("{{ bos_token }}" + own.read_text())
    before = greedy(env)
    bad = recipe(
        folder, "r2", ("  serve:\n", f"  extra_args: [--chat-template, {doubled}]\n  serve:\n")
    )
    result = upgrade(env, bad, "--no-bench")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "doubled BOS" in result.stdout and "rolled back to revision 1" in result.stdout
    revisions = history(env)
    assert [r["outcome"] for r in revisions] == ["good", "failed"]
    assert revisions[1]["reason"].startswith("smoke template: the special prefix")
    assert greedy(env) == before


def test_a_much_slower_revision_fails_the_bench_gate_and_is_rolled_back(deployment):
    """The slow kind: two sequences at a time (``max_num_seqs: 2``) under the gate bench's
    concurrency of 4 serves the same answers at about half the throughput (one at a time, a
    quarter, failed the same and took twice as long to measure)."""
    folder, env = deployment
    before, known = greedy(env), len(history(env))
    running = json.loads(run_tandem("status", NAME, "--json", env=env).stdout)["revision"]
    slow = recipe(folder, "r3", ("max_num_seqs: 8", "max_num_seqs: 2"))
    result = upgrade(env, slow)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "bench: slower than the limit beyond the noise" in result.stdout, result.stdout
    assert f"rolled back to revision {running}" in result.stdout
    revisions = history(env)
    assert len(revisions) == known + 1 and revisions[-1]["outcome"] == "failed"
    assert revisions[-1]["reason"].startswith("bench: slower than the limit"), revisions[-1]
    assert greedy(env) == before
