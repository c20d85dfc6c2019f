"""Whole CUDA boots under `tandem up`, cold, warm and after a supervised restart, read back.

The logs under tests/fixtures/gpu/starts are the leader's (rank 0) log of real `tandem up`
starts of the Llama-3.1-8B shape with CUDA vLLM 0.25.1 on the lent H200 (2026-12-01,
benchmarks/gpu/session.sh): TP 1 on the one GPU (cold), and TP 2 across two network
namespaces sharing it, cold, warm (the compile caches kept by `tandem down`) and the group that
`tandem supervise` restarted after rank 1 was killed. Unlike the boots of tests/fixtures/gpu/
boots, these ran to the first answer, so graph capture and the API server are in them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tandem.plan.status import planned_vs_boot
from tandem.vllm_log import BootLog, Phase

ROOT = Path(__file__).resolve().parents[2]
STARTS = ROOT / "tests" / "fixtures" / "gpu" / "starts"


def read(name: str) -> BootLog:
    log = BootLog(rank=0)
    for line in (STARTS / f"llama-3.1-8b-{name}-rank0.log").read_text().splitlines():
        log.feed(line)
    return log


@pytest.mark.parametrize(
    ("name", "cache", "init_s"),
    [
        ("tp1-cold", "cold", 35.84),
        ("tp2-cold", "cold", 79.27),
        ("tp2-warm", "warm", 41.5),
        ("tp2-restart", "warm", 40.48),
    ],
)
def test_every_phase_of_a_whole_cuda_boot_in_order(name, cache, init_s):
    log = read(name)
    assert [p for p, _ in log.phases] == [
        Phase.RENDEZVOUS,
        Phase.WEIGHTS_LOADED,
        Phase.COMPILED,
        Phase.KV_CACHE,
        Phase.GRAPHS,
        Phase.API_SERVER,
    ]
    assert log.figures.compile_cache == cache
    assert log.figures.engine_init_s == init_s
    assert dict(log.phases)[Phase.COMPILED].startswith(cache)


def test_a_warm_start_loads_what_the_cold_one_compiled():
    """The cache root tandem keeps: the same compile-cache folder, loaded instead of written."""
    cold = (STARTS / "llama-3.1-8b-tp2-cold-rank0.log").read_text()
    warm = (STARTS / "llama-3.1-8b-tp2-warm-rank0.log").read_text()
    assert "Compiling a graph for compile range (1, 8192)" in cold
    assert "Directly load the compiled graph(s) for compile range (1, 8192)" in warm
    assert "Compiling a graph for compile range" not in warm
    assert "torch.compile took 21.62 s in total" in cold
    assert "torch.compile took 3.95 s in total" in warm


def test_status_planned_vs_actual_on_the_h200_within_half_a_percent():
    """What `tandem status` showed for the TP 1 start, recomputed from the recipe, the cluster,
    the model's recorded safetensors headers and the leader's log."""
    recipe = yaml.safe_load((ROOT / "examples/recipes/gpu-llama8b-tp1.yaml").read_text())
    recipe["model"]["path"] = str(ROOT / "tests/fixtures/gpu/models/llama-3.1-8b")
    cluster = yaml.safe_load((ROOT / "examples/gpu-cluster-h200.yaml").read_text())
    result = planned_vs_boot(recipe, cluster, read("tp1-cold").figures)
    assert result.unavailable is None
    tokens = result.comparison.kv_pool_tokens
    assert tokens.measured == 896_912 and abs(tokens.error_pct) < 0.5
    shown = json.loads((STARTS / "llama-3.1-8b-tp1-status.json").read_text())
    # recorded by the planner of 2026-12-01; the profile-run walk (issue 33) moved it 0.03 %
    recorded = shown["planned"]["comparison"]["kv_pool_tokens"]
    assert recorded["measured"] == tokens.measured
    assert abs(recorded["planned"] - tokens.planned) / tokens.planned < 0.001


@pytest.mark.parametrize(
    ("name", "seconds"),
    [("tp1-cold", 16.2), ("tp2-cold", 21.62), ("tp2-warm", 3.95), ("tp2-restart", 3.98)],
)
def test_the_torch_compile_seconds_are_read_cold_or_warm(name, seconds):
    """Logged after the cache line, which takes the `compiled` phase: kept as a figure."""
    assert read(name).figures.compile_s == seconds
