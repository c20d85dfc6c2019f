"""The built-in seed recipes render exactly what the seeds run, flag by flag, variable by variable.

The seeds' own text is kept verbatim under tests/fixtures/seeds/.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from test_rankplan import flags

from tandem.rankplan import plan_ranks
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_cluster, load_recipe

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT / "tests" / "fixtures" / "seeds"


def env_file(name: str) -> dict[str, str]:
    out = {}
    for line in (SEEDS / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


def seed000_argv() -> list[str]:
    text = (SEEDS / "seed000-leader.sh").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    body = body.replace("\\\n", " ")
    return shlex.split(body)


def seed000_plan():
    deployment = Deployment(
        recipe=load_recipe("deepseek-v4-flash-dspark"),
        cluster=load_cluster(ROOT / "examples" / "dgx-spark-eks.yaml"),
    )
    return plan_ranks(deployment)


def test_seed000_leader_matches_flag_for_flag():
    seed = flags(seed000_argv())
    ours = flags(seed000_plan().leader.argv)
    assert ours == seed


def test_seed000_leader_keeps_the_seed_flag_order():
    seed_order = [a for a in seed000_argv() if a.startswith("--")]
    our_order = [a for a in seed000_plan().leader.argv if a.startswith("--")]
    assert our_order == seed_order


def test_seed000_worker_is_the_leader_with_node_rank_1_and_headless():
    seed = flags(seed000_argv())
    seed["--node-rank"] = "1"
    seed["--headless"] = None
    worker = seed000_plan().ranks[1]
    assert worker.role == "worker"
    assert flags(worker.argv) == seed


def test_seed000_model_is_the_snapshot_of_the_seed_repo_served_offline():
    # The seed serves "$MODEL_PATH", the hub-cache snapshot of DeepSeek-V4-Flash-DSpark; with
    # HF_HUB_OFFLINE=1 vLLM resolves the repo id to that same snapshot.
    leader = seed000_plan().leader
    assert leader.argv[2] == "deepseek-ai/DeepSeek-V4-Flash-DSpark"
    assert leader.env["HF_HUB_OFFLINE"] == "1"
    assert leader.env["HF_HOME"] == "/root/.cache/huggingface"


def test_seed000_environment_variable_by_variable_on_both_ranks():
    seed = env_file("seed000.env")
    for rank in seed000_plan().ranks:
        assert {k: rank.env.get(k) for k in seed} == seed, rank.role
        # The only additions are the node's own address and tandem's process marks.
        extra = set(rank.env) - set(seed)
        assert extra == {"HF_HOME", "VLLM_HOST_IP", "TANDEM_DEPLOYMENT", "TANDEM_RANK", "SPT_NOENV"}


def test_seed000_forbidden_b12x_flags_absent():
    env = seed000_plan().leader.env
    assert not {"VLLM_USE_B12X_MHC", "VLLM_USE_B12X_WO_PROJECTION", "VLLM_USE_B12X_FP8_GEMM"} & set(
        env
    )


def seed002_plan():
    deployment = Deployment(
        recipe=load_recipe("deepseek-v4-flash"),
        cluster=load_cluster(ROOT / "examples" / "dgx-spark-pair.yaml"),
    )
    return plan_ranks(deployment)


SEED002_FLAGS = {
    "port": "--port",
    "host": "--host",
    "tensor_parallel": "--tensor-parallel-size",
    "pipeline_parallel": "--pipeline-parallel-size",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "block_size": "--block-size",
    "served_model_name": "--served-model-name",
}


def test_seed002_configuration_table_setting_by_setting():
    rows = [
        line.split("\t")
        for line in (SEEDS / "seed002-settings.tsv").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    for rank in seed002_plan().ranks:
        f = flags(rank.argv)
        for setting, value in rows:
            assert f[SEED002_FLAGS[setting]] == value, setting


def test_seed002_mtp2_fp8_kv_no_ray_expert_parallel_and_parsers():
    leader, worker = seed002_plan().ranks
    f = flags(leader.argv)
    assert leader.argv[2] == "deepseek-ai/DeepSeek-V4-Flash"
    assert f["--speculative-config"] == '{"method":"deepseek_mtp","num_speculative_tokens":2}'
    assert f["--kv-cache-dtype"] == "fp8"
    assert f["--distributed-executor-backend"] == "mp"
    assert f["--load-format"] == "safetensors"
    assert "--enable-expert-parallel" in f
    assert (
        f["--tokenizer-mode"] == f["--reasoning-parser"] == f["--tool-call-parser"] == "deepseek_v4"
    )
    assert f["--master-addr"] == "169.254.73.22" and "--headless" in flags(worker.argv)


def test_seed002_environment_table_variable_by_variable():
    seed = env_file("seed002.env")
    for rank in seed002_plan().ranks:
        assert {k: rank.env.get(k) for k in seed} == seed
        assert rank.env["VLLM_HOST_IP"] in ("169.254.73.22", "169.254.134.1")
