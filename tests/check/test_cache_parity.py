"""The cache-parity rule on real cache folders read by the real probe: cold on all ranks, warm
on all with the same key, and a cache planted on one rank (found before launch, with the fix)."""

from __future__ import annotations

from pathlib import Path

from tandem import caches
from tandem.check import probe
from tandem.check.findings import Severity
from tandem.check.rules import CheckContext, evaluate
from tests.check.conftest import facts_of, seed_deployment


def plant(root: Path, *paths: str) -> None:
    """Files under a cache root, as vLLM and the JIT libraries lay them out."""
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("x")


def compiled(root: Path, rank: int) -> None:
    graphs = f"vllm/torch_compile_cache/3f9a1c0b2d/rank_{rank}_0"
    plant(root, f"{graphs}/backbone/cache_key_factors.json", f"{graphs}/inductor_cache/ab/x.py",
          "vllm/modelinfos/DeepseekV3ForCausalLM.json", "vllm/tmpk2j3/partial")


def facts_with_cache(node: str, root: Path) -> dict:
    facts = facts_of(node)
    facts["compile_cache"] = probe.compile_cache_facts(probe.Node(), str(root))
    return facts


def parity(tmp_path: Path) -> list:
    deployment = seed_deployment()
    facts = {n: facts_with_cache(n, tmp_path / n) for n in ("spark-101", "spark-102")}
    return [f for f in evaluate(CheckContext(deployment=deployment, facts=facts))
            if f.rule == "cache-parity"]


def test_cold_on_every_rank_is_fine_and_said(tmp_path: Path):
    (findings,) = parity(tmp_path)
    assert findings.severity is Severity.INFO
    assert findings.message.startswith("compile caches cold on every rank")


def test_the_same_compiled_graphs_on_every_rank_are_one_key(tmp_path: Path):
    compiled(tmp_path / "spark-101", 0)
    compiled(tmp_path / "spark-102", 1)
    (finding,) = parity(tmp_path)
    assert finding.severity is Severity.INFO and "warm on every rank" in finding.message


def test_a_cache_planted_on_one_rank_is_an_error_with_the_fix(tmp_path: Path):
    compiled(tmp_path / "spark-101", 0)
    compiled(tmp_path / "spark-102", 1)
    plant(tmp_path / "spark-102", "vllm/flashinfer_autotune_cache/x/autotune_configs.json")
    (finding,) = parity(tmp_path)
    assert finding.severity is Severity.ERROR and finding.node == "spark-102"
    assert "only here: vllm/flashinfer_autotune_cache/x" in finding.evidence
    assert "--purge-caches" in finding.fix and f"{tmp_path}/spark-101/" in finding.fix


def test_a_warm_leader_and_a_cold_worker_differ(tmp_path: Path):
    compiled(tmp_path / "spark-101", 0)
    (finding,) = parity(tmp_path)
    assert finding.severity is Severity.ERROR and finding.node == "spark-102"
    assert "(cold)" in finding.message and "(warm" in finding.message


def test_the_key_ignores_the_rank_folder_and_scratch_names():
    assert caches.cache_key([]) is None
    assert caches.cache_key(["vllm/tmpabc"]) is None
    assert caches.cache_key(["vllm/torch_compile_cache/h/rank_0_0"]) == \
        caches.cache_key(["vllm/torch_compile_cache/h/rank_1_0", "triton/x.lock"])
    assert caches.cache_key(["vllm/torch_compile_cache/h"]) != \
        caches.cache_key(["vllm/torch_compile_cache/g"])


def test_every_rank_has_its_own_root_outside_what_down_removes(tmp_path: Path):
    assert caches.local_root(tmp_path, "tiny", 1) == tmp_path / "caches" / "tiny" / "rank1"
    assert str(caches.remote_root("/srv/tandem", "tiny", 0)) == "/srv/tandem/tiny/caches/rank0"
    env = caches.cache_env("/cache/tandem")
    assert set(env) == {"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
                        "FLASHINFER_WORKSPACE_BASE", "DG_JIT_CACHE_DIR", "TILELANG_CACHE_DIR"}
    assert len(set(env.values())) == len(env)
    assert all(v.startswith("/cache/tandem/") for v in env.values())


def test_aot_folders_hashed_with_each_ranks_own_variables_are_one_key():
    # vLLM 0.32 on two CPU ranks binding different cores: same graphs, different AOT digests.
    rank0 = ["vllm/torch_compile_cache/torch_aot_compile/" + "202b059a" * 8]
    rank1 = ["vllm/torch_compile_cache/torch_aot_compile/" + "0145e560" * 8]
    assert caches.cache_key(rank0) == caches.cache_key(rank1)
    assert caches.cache_key(rank0) != caches.cache_key(rank0 + rank1)
    assert caches.differences(rank0 + rank1, rank0) == (
        ["vllm/torch_compile_cache/torch_aot_compile/<digest>"], [])
