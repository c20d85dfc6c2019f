"""The cache-parity rule on real cache folders read by the real probe: cold on all ranks, warm
on all with the same key, and a cache planted on one rank (found before launch, with the fix)."""

from __future__ import annotations

from pathlib import Path

from tandem import agent, caches
from tandem.check.findings import Severity
from tandem.check.rules import CheckContext, evaluate
from tests.check.conftest import facts_of, seed_deployment


def plant(root: Path, *paths: str) -> None:
    """Files under a cache root, as vLLM and the JIT libraries lay them out."""
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("x")


def compiled(root: Path, rank: int) -> None:
    """What one rank of the same deployment writes: kernels named differently on each rank."""
    graphs = f"vllm/torch_compile_cache/3f9a1c0b2d/rank_{rank}_0"
    aot = "vllm/torch_compile_cache/torch_aot_compile/" + ("202b059a", "0145e560")[rank] * 8
    plant(
        root,
        f"{graphs}/backbone/cache_key_factors.json",
        f"{graphs}/inductor_cache/k{rank}/c{rank}x.py",
        f"{aot}/rank_{rank}_0/model",
        f"{aot}/inductor_cache/fxgraph/f{rank}/entry",
        f"inductor/u{rank}/c{rank}.main.so",
        "vllm/modelinfos/DeepseekV3ForCausalLM.json",
        "vllm/tmpk2j3/partial",
    )


def cache_facts(root: Path) -> dict:
    return agent.compile_cache_facts(
        agent.Node(),
        str(root),
        caches.ENTRY_DEPTH,
        named=caches.NAMED_FOLDERS,
        opaque=caches.OPAQUE_FOLDERS,
    )


def facts_with_cache(node: str, root: Path) -> dict:
    facts = facts_of(node)
    facts["compile_cache"] = cache_facts(root)
    return facts


def parity(tmp_path: Path) -> list:
    deployment = seed_deployment()
    facts = {n: facts_with_cache(n, tmp_path / n) for n in ("spark-101", "spark-102")}
    return [
        f
        for f in evaluate(CheckContext(deployment=deployment, facts=facts))
        if f.rule == "cache-parity"
    ]


def test_cold_on_every_rank_is_fine_and_said(tmp_path: Path):
    (findings,) = parity(tmp_path)
    assert findings.severity is Severity.INFO
    assert findings.message.startswith("compile caches cold on every rank")


def test_an_eager_deployment_is_not_promised_compiled_graphs(tmp_path: Path):
    deployment = seed_deployment(engine__serve__enforce_eager=True)
    facts = {n: facts_with_cache(n, tmp_path / n) for n in ("spark-101", "spark-102")}
    (finding,) = [
        f
        for f in evaluate(CheckContext(deployment=deployment, facts=facts))
        if f.rule == "cache-parity"
    ]
    assert "enforce_eager is on" in finding.message and "loads compiled" not in finding.message


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
    assert "only here: vllm/flashinfer_autotune_cache/x/autotune_configs.json" in finding.evidence
    assert "--purge-caches" in finding.fix and f"{tmp_path}/spark-101/" in finding.fix


def test_a_warm_leader_and_a_cold_worker_differ(tmp_path: Path):
    compiled(tmp_path / "spark-101", 0)
    (finding,) = parity(tmp_path)
    assert finding.severity is Severity.ERROR and finding.node == "spark-102"
    assert "(cold)" in finding.message and "(warm" in finding.message


def test_the_key_ignores_rank_folders_digests_kernel_names_and_scratch(tmp_path: Path):
    for rank in (0, 1):
        compiled(tmp_path / f"r{rank}", rank)
    assert caches.cache_key(cache_facts(tmp_path / "missing")) is None
    plant(tmp_path / "scratch", "vllm/tmpabc")
    assert caches.cache_key(cache_facts(tmp_path / "scratch")) is not None  # a file: warm
    keys = {caches.cache_key(cache_facts(tmp_path / f"r{rank}")) for rank in (0, 1)}
    assert len(keys) == 1 and None not in keys


def test_every_rank_has_its_own_root_outside_what_down_removes(tmp_path: Path):
    assert caches.local_root(tmp_path, "tiny", 1) == tmp_path / "caches" / "tiny" / "rank1"
    assert str(caches.remote_root("/srv/tandem", "tiny", 0)) == "/srv/tandem/tiny/caches/rank0"
    env = caches.cache_env("/cache/tandem")
    assert set(env) == {
        "VLLM_CACHE_ROOT",
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "FLASHINFER_WORKSPACE_BASE",
        "DG_JIT_CACHE_DIR",
        "TILELANG_CACHE_DIR",
    }
    assert len(set(env.values())) == len(env)
    assert all(v.startswith("/cache/tandem/") for v in env.values())


def test_a_second_aot_digest_on_one_rank_changes_its_key(tmp_path: Path):
    compiled(tmp_path / "r0", 0)
    compiled(tmp_path / "r1", 1)
    plant(
        tmp_path / "r1",
        "vllm/torch_compile_cache/torch_aot_compile/" + "5eeded00" * 8 + "/rank_1_0/model",
    )
    here, there = caches.differences(cache_facts(tmp_path / "r1"), cache_facts(tmp_path / "r0"))
    assert here == ["vllm/torch_compile_cache/torch_aot_compile/<digest>/rank_*/model"]
    assert there == []


def test_a_kernel_store_on_one_rank_only_changes_its_key(tmp_path: Path):
    compiled(tmp_path / "r0", 0)
    compiled(tmp_path / "r1", 1)
    plant(tmp_path / "r1", "triton/abc/kernel.json")
    assert caches.differences(cache_facts(tmp_path / "r1"), cache_facts(tmp_path / "r0")) == (
        ["triton/"],
        [],
    )


def test_a_root_under_the_home_folder_is_read_there(tmp_path: Path, monkeypatch):
    # An ssh cluster's remote_dir `~/tandem` reaches the probe as a literal `~` in its argv.
    monkeypatch.setenv("HOME", str(tmp_path))
    compiled(tmp_path / "tandem" / "caches" / "d" / "rank0", 0)
    facts = agent.compile_cache_facts(
        agent.Node(), "~/tandem/caches/d/rank0", caches.ENTRY_DEPTH, named=caches.NAMED_FOLDERS
    )
    assert facts["exists"] and facts["root"] == str(tmp_path / "tandem/caches/d/rank0")
    assert facts["entries"]
