#!/usr/bin/env python3
"""`tandem plan` against the recorded CUDA vLLM boots: weights, KV memory, KV tokens, concurrency.

Runs anywhere (no GPU): each boot of ``boots.jsonl`` (written on the device by ``boots.py``) is
re-planned with the recipe and cluster it ran with, from the header-only model folders recorded
there (config.json + safetensors headers), and compared with what vLLM logged.

    python3 benchmarks/gpu/plan_vs_boots.py tests/fixtures/gpu > benchmarks/gpu/results/planner.md

Split of the boots: *fitted*, the dense boots the H200 constants (non-torch memory) were read
off: TP 1 at util 0.90 and TP 2 at util 0.35 of the three first shapes; *probed*, the eager
boots whose torch memory history (``vllm_probe.py``) was read to check the profile-run walk of
``tandem.plan.profile_run`` buffer by buffer, and deepseek-v3-4l-u0.90-graph, on which its one
calibrated constant (the PIECEWISE graph pool) was fitted; *judged*, every other boot (the
``-len8192-seqs64`` and ``-seqs1024`` ones were planned before they were booted).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from tandem.plan.calibrate import figures_from_log
from tandem.plan.config import facts_from_dir
from tandem.plan.hardware import load_profile
from tandem.plan.memory import ReserveKind
from tandem.plan.planner import Plan, plan_deployment
from tandem.spec.loading import load_deployment

GIB = 1024**3
FITTED_SHAPES = ("llama-3.1-8b", "deepseek-v2-lite", "gemma-3-4b")
FITTED = {(1, 0.90), (2, 0.35)}
PROBED = {
    "deepseek-v3-4l-u0.90-eager-tp1",
    "deepseek-v3-5l-u0.90-eager-tp1",
    "qwen3-30b-a3b-8l-u0.90-eager-tp1",
    "mixtral-8x7b-4l-u0.90-eager-tp1",
    "deepseek-v3-4l-u0.90-graph-tp1",
    "llama-3.1-8b-u0.90-eager-tp1-probe",
    "gemma-3-4b-u0.90-eager-tp1-probe",
    "deepseek-v3-4l-u0.90-eager-tp1-len2048-seqs256",
}
_WEIGHTS = re.compile(r"Model loading took ([\d.]+) GiB")
_ACTIVATION = re.compile(r"torch peak memory increase: ([\d.]+)GiB")
_NON_TORCH = re.compile(r"non-torch forward increase memory: ([\d.]+)GiB")
_GRAPHS = re.compile(r"Estimated CUDA graph memory: ([\d.]+) GiB total")

RECIPE = """name: {name}
model: {{repo_id: {repo}, served_name: {shape}, offline: true}}
engine:
  vllm_version: 0.25.1
  executor: mp
  serve:
    tensor_parallel_size: {tp}
    enable_expert_parallel: {ep}
    max_model_len: {max_model_len}
    max_num_seqs: {max_num_seqs}
    gpu_memory_utilization: {util}
    enforce_eager: {eager}
    generation_config: vllm
"""
CLUSTER_1 = """name: gpu-1
transport: local
local: {isolation: loopback}
nodes:
  - {name: node0, address: 127.0.0.1, gpus: 1, env: {CUDA_VISIBLE_DEVICES: "0"}}
"""
CLUSTER_2 = """name: gpu-netns
transport: local
local: {isolation: netns, subnet: 10.77.0.0/24}
nodes:
  - {name: node0, address: 10.77.0.1, gpus: 1, env: {CUDA_VISIBLE_DEVICES: "0", NCCL_HOSTID: node0}}
  - {name: node1, address: 10.77.0.2, gpus: 1, env: {CUDA_VISIBLE_DEVICES: "0", NCCL_HOSTID: node1}}
"""


class Row(BaseModel):
    """One boot: what vLLM logged and what the planner said."""

    boot: str
    role: str = Field(description="`fitted`, `probed` or `judged` (module docstring).")
    weights_gib: float | None
    planned_weights_gib: float
    activation_gib: float | None
    planned_activation_gib: float
    non_torch_gib: float | None
    planned_non_torch_gib: float
    graphs_gib: float = Field(description="vLLM's CUDA-graph estimate; 0 when none logged.")
    planned_graphs_gib: float
    available_kv_gib: float | None
    planned_kv_gib: float
    kv_tokens: int
    planned_kv_tokens: int
    max_concurrency: float | None
    planned_max_concurrency: float

    @property
    def kv_error_pct(self) -> float:
        return (self.planned_kv_tokens - self.kv_tokens) / self.kv_tokens * 100


def boot_plan(fixtures: Path, boot: dict) -> Plan:
    """``tandem plan`` of one recorded boot, with the recipe and cluster it ran with."""
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "recipe.yaml"
        cluster = Path(tmp) / "cluster.yaml"
        recipe.write_text(
            RECIPE.format(
                name=boot["boot"].replace(".", "")[:40].rstrip("-"),
                repo=boot["repo_id"],
                shape=boot["shape"],
                tp=boot["tp"],
                ep="true" if boot.get("expert_parallel") else "false",
                max_model_len=boot["max_model_len"],
                max_num_seqs=boot["max_num_seqs"],
                util=boot["util"],
                eager="true" if boot["mode"] == "eager" else "false",
            )
        )
        cluster.write_text(CLUSTER_1 if boot["tp"] == 1 else CLUSTER_2)
        deployment = load_deployment(
            str(recipe), str(cluster), as_root=True, cpu_count=16, gpu_count=1
        )
    model_dir = fixtures / "models" / boot["repo_id"].split("/", 1)[1]
    facts = facts_from_dir(model_dir, boot["repo_id"], "recorded headers")
    return plan_deployment(deployment, facts, load_profile("h200"), use_shipped_boots=False)


def plan_boot(fixtures: Path, boot: dict) -> Row:
    """Re-plan one recorded boot and read its log."""
    plan = boot_plan(fixtures, boot)
    leader = (fixtures / "boots" / f"{boot['boot']}-rank0.log").read_text(errors="replace")
    figures = figures_from_log(leader)
    reserves: dict[ReserveKind, float] = {}
    for r in plan.memory.reserves:
        reserves[r.kind] = reserves.get(r.kind, 0.0) + r.bytes / GIB
    return Row(
        boot=boot["boot"],
        role=role(boot),
        weights_gib=_logged(_WEIGHTS, leader),
        planned_weights_gib=plan.weights_gib_per_rank,
        activation_gib=_logged(_ACTIVATION, leader),
        planned_activation_gib=reserves.get(ReserveKind.ACTIVATION, 0.0),
        non_torch_gib=_logged(_NON_TORCH, leader),
        planned_non_torch_gib=reserves.get(ReserveKind.NON_TORCH, 0.0),
        graphs_gib=_logged(_GRAPHS, leader) or 0.0,
        planned_graphs_gib=reserves.get(ReserveKind.CUDA_GRAPHS, 0.0),
        available_kv_gib=figures.available_kv_cache_gib,
        planned_kv_gib=plan.kv_pool_gib,
        kv_tokens=figures.kv_cache_tokens,
        planned_kv_tokens=plan.kv_pool_tokens,
        max_concurrency=figures.max_concurrency,
        planned_max_concurrency=round(plan.max_concurrency, 2),
    )


def role(boot: dict) -> str:
    """Which set a boot is in (module docstring)."""
    if boot["boot"] in PROBED:
        return "probed"
    fitted = boot["shape"] in FITTED_SHAPES and (boot["tp"], boot["util"]) in FITTED
    return "fitted" if fitted else "judged"


def _logged(pattern: re.Pattern[str], text: str) -> float | None:
    found = pattern.search(text)
    return float(found.group(1)) if found else None


def recorded_boots(fixtures: Path) -> list[dict]:
    lines = (fixtures / "boots" / "boots.jsonl").read_text().splitlines()
    return [b for b in map(json.loads, lines) if b["status"] == "ok"]


def _pair(logged: float | None, planned: float) -> str:
    return f"{'—' if logged is None else logged} / {planned:.2f}"


def markdown(rows: list[Row]) -> str:
    out = [
        "| boot | set | weights | activation peak | non-torch | CUDA graphs | available KV "
        "| KV tokens logged | planned | error | max conc. logged / planned |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.boot} | {r.role} | {_pair(r.weights_gib, r.planned_weights_gib)} "
            f"| {_pair(r.activation_gib, r.planned_activation_gib)} "
            f"| {_pair(r.non_torch_gib, r.planned_non_torch_gib)} "
            f"| {_pair(r.graphs_gib, r.planned_graphs_gib)} "
            f"| {_pair(r.available_kv_gib, r.planned_kv_gib)} "
            f"| {r.kv_tokens:,} | {r.planned_kv_tokens:,} | {r.kv_error_pct:+.2f} % "
            f"| {r.max_concurrency}x / {r.planned_max_concurrency}x |"
        )
    worst = max(rows, key=lambda r: abs(r.kv_error_pct))
    out.append(
        "\nGiB, logged / planned (vLLM prints two decimals). "
        f"Worst KV-token error: {worst.kv_error_pct:+.2f} % ({worst.boot}); "
        f"{sum(abs(r.kv_error_pct) <= 1 for r in rows)} of {len(rows)} boots within 1 %."
    )
    return "\n".join(out)


def main() -> None:
    fixtures = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gpu")
    rows = [plan_boot(fixtures, b) for b in recorded_boots(fixtures)]
    print(markdown(rows))


if __name__ == "__main__":
    main()
