"""The node agent's liveness probe (``tandem.agent alive``), run as a pod runs it: the
ConfigMap's ``agent.py`` as a file, ``python3 /opt/tandem/agent.py alive ...``."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import make_recipe

from tandem import agent, wire
from tandem.render import kubernetes as k8s_render
from tandem.spec.deployment import Deployment, local_cluster


@pytest.fixture(scope="module")
def agent_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent as the ConfigMap mounts it: its ``data`` written to a read-only file."""
    deployment = Deployment(recipe=make_recipe(), cluster=local_cluster(2))
    config_map = k8s_render.agent_config_map(deployment)
    path = tmp_path_factory.mktemp("opt-tandem") / k8s_render.AGENT_FILE
    path.write_text(config_map["data"][k8s_render.AGENT_FILE])
    path.chmod(0o444)
    assert path.read_text() == inspect.getsource(agent)
    return path


@pytest.fixture
def probe(agent_file: Path):
    def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(agent_file), "alive", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    return run


@pytest.fixture
def worker_process():
    """A process renamed like vLLM's worker, marked as a rank's processes are."""
    env = {
        **os.environ,
        wire.TANDEM_DEPLOYMENT: "probe-test",
        wire.TANDEM_RANK: "1",
        wire.SPT_NOENV: "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import setproctitle, time; "
            "setproctitle.setproctitle('VLLM::Worker_TP1'); time.sleep(60)",
        ],
        env=env,
    )
    time.sleep(1)
    yield proc
    proc.kill()
    proc.wait()


def test_a_worker_pod_is_alive_while_its_worker_runs_and_not_when_stopped(worker_process, probe):
    assert probe("worker", "--deployment", "probe-test").stdout.strip() == "alive"
    os.kill(worker_process.pid, signal.SIGSTOP)
    try:
        result = probe("worker", "--deployment", "probe-test")
    finally:
        os.kill(worker_process.pid, signal.SIGCONT)
    assert result.returncode == 1
    assert f"VLLM::Worker_TP (pid {worker_process.pid}) is stopped" in result.stdout  # comm: 15


def test_a_pod_without_its_worker_process_is_not_alive(probe):
    result = probe("worker", "--deployment", "nothing-runs-here")
    assert result.returncode == 1 and "no VLLM::Worker process" in result.stdout


def test_metrics_sum_the_token_counters_over_engines():
    text = (
        '# HELP vllm:prompt_tokens_total x\nvllm:prompt_tokens_total{engine="0"} 10.0\n'
        'vllm:prompt_tokens_total{engine="1"} 5.0\nvllm:generation_tokens_total 7.0\n'
        'vllm:num_requests_running{engine="0"} 2.0\nvllm:other 1\n'
    )
    assert agent.token_counters(text) == {
        "vllm:prompt_tokens_total": 15.0,
        "vllm:generation_tokens_total": 7.0,
        "vllm:num_requests_running": 2.0,
    }


@pytest.mark.engine
def test_the_leader_probe_passes_on_the_real_deployment(tiny_deployment, tmp_path, probe):
    status = json.loads(tiny_deployment.tandem("status", "--json").stdout)
    env = {**tiny_deployment.env}
    result = probe(
        "leader",
        "--deployment",
        tiny_deployment.name,
        "--url",
        tiny_deployment.endpoint,
        "--model",
        status["model"],
        "--state-file",
        str(tmp_path / "state.json"),
        env=env,
    )
    assert result.returncode == 0 and result.stdout.strip() == "alive", result.stdout
    worker = probe("worker", "--deployment", tiny_deployment.name, env=env)
    assert worker.returncode == 0, worker.stdout
