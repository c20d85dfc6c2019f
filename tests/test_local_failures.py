"""Start-up failures with the real engine: the cause is printed and nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tandem.backends.processes import marked_processes

pytestmark = pytest.mark.engine

BROKEN = """\
name: absent-model
model: {repo_id: tandem-org/absent-model, offline: true}
engine:
  serve: {tensor_parallel_size: 2, max_model_len: 1024, enforce_eager: true}
env: {VLLM_CPU_KVCACHE_SPACE: 1}
"""

# Its own subnet: the session's tiny-local deployment may be up on the default 10.77.0.0/24.
CLUSTER = """\
name: failures
transport: local
local: {isolation: auto, subnet: 10.79.0.0/24}
nodes:
  - {name: node0, address: 10.79.0.1, control_plane_interface: tdm0,
     env: {VLLM_CPU_OMP_THREADS_BIND: "0"}}
  - {name: node1, address: 10.79.0.2, control_plane_interface: tdm1,
     env: {VLLM_CPU_OMP_THREADS_BIND: "1"}}
"""


def test_rank_failing_at_start_stops_every_rank_and_prints_the_cause(tmp_path, tiny_hf_home):
    # --skip-checks: the preflight would refuse the absent snapshot before vLLM starts.
    recipe = tmp_path / "absent.yaml"
    recipe.write_text(BROKEN)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    env = {**os.environ, "HF_HOME": str(tiny_hf_home), "TANDEM_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "up",
            str(recipe),
            "--cluster",
            str(cluster),
            "--timeout",
            "400",
            "--skip-checks",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2
    assert "exited with status" in result.stderr
    assert "LocalEntryNotFoundError" in result.stderr
    assert "not in this node's Hugging Face cache" in result.stderr  # the fix, not just the cause
    assert "start-up failed: stopping every rank" in result.stdout
    assert marked_processes("absent-model") == {}
    if os.geteuid() == 0:
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "tdm-absent-model" not in namespaces
