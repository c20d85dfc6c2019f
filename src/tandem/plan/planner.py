"""``plan_deployment``: a Deployment, model facts and a hardware profile in, a ``Plan`` out.

Steps, in order:

1. Resolve the serve options vLLM would use (recipe values, else vLLM's defaults, labelled).
2. Lay out the KV cache for the architecture (``kv``) and one rank's memory (``memory``).
3. Where a measured vLLM boot of the same model on the same hardware ships with tandem,
   calibrate on it: the ratio of measured to modelled tokens at that boot's pool scales the
   capacity, and the measured non-KV memory minus the modelled one becomes a calibrated
   reserve. Architecture formulas then carry only the *differences* between that boot and this
   recipe, as model-physics.md §6 advises.
4. Verdict and changes (``memory.fit_verdict``), decode roofline (``roofline``).
5. Compare with figures others reported for the model (``kind: claim``) and explain any gap.

Pure: no I/O besides what the caller passed in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tandem import wire
from tandem.errors import PlanError
from tandem.plan.calibrate import Calibration
from tandem.plan.config import ModelFacts, facts_of
from tandem.plan.hardware import HardwareProfile, listed_profiles, load_profile, profile_names
from tandem.plan.kv import KVLayout
from tandem.plan.memory import (
    GIB,
    Fit,
    MemoryPlan,
    Reserve,
    ReserveKind,
    ServeSettings,
    fit_verdict,
    layout_for,
    memory_plan,
    model_max_len,
    resolve_settings,
)
from tandem.plan.roofline import Roofline, roofline
from tandem.spec.cluster import Transport
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import Recipe

SCHEMA_VERSION = 1


class Explanation(BaseModel):
    """A reported figure that differs from the plan, and why."""

    claim: str
    source: str
    claimed_kv_pool_tokens: int | None
    planned_kv_pool_tokens: int
    difference_pct: float
    implied_kv_pool_gib: float | None
    equivalent_gpu_memory_utilization: float | None
    extra_non_kv_gib: float | None
    text: str


class Plan(BaseModel):
    """What ``tandem plan --json`` prints. Every number carries its unit in its name."""

    schema_version: int = SCHEMA_VERSION
    deployment: str
    model: str
    model_source: str
    hardware: str
    nodes: int
    settings: ServeSettings
    weights_bytes_per_rank: int
    weights_gib_per_rank: float
    kv_bytes_per_token: float = Field(
        description="Pool bytes per reported token at "
        "max_model_len (what vLLM's token figure costs)."
    )
    kv_bytes_per_token_ideal: float = Field(description="Bytes one token adds, no padding.")
    kv_bytes_per_token_layout_model: float = Field(
        description="Per reported token, before calibration on a measured boot."
    )
    kv_capacity_scale: float = Field(
        description="Measured / modelled tokens of a shipped boot; 1.0 when none applies."
    )
    kv_pool_bytes: int
    kv_pool_gib: float
    kv_pool_tokens: int
    max_concurrency: float = Field(description="Requests of max_model_len at once.")
    max_model_len_tokens: int
    fits: bool
    per_node_memory_bytes: int
    per_node_memory_gb: float
    decode_roofline_tok_s: float = Field(description="Single-stream upper bound, tokens/s.")
    decode_roofline_at_concurrency_tok_s: float
    memory: MemoryPlan
    kv: KVLayout
    fit: Fit
    roofline: Roofline
    notes: list[str]
    explanations: list[Explanation]
    calibration: Calibration | None = None


def _shared_graphs_note(reserves: list[Reserve], sharing: int) -> str:
    """vLLM's CUDA-graph estimate reads the device's free memory around a few captures; on a
    GPU shared by ranks that profile at the same time it also counts what the others allocate
    then (their profile run, their captures), by timing. Measured on one H200 for two identical
    DeepSeek-V3 ranks whose own captures reserved 1.05 GiB: 2.42 and 4.56 GiB estimated, and
    the smaller rank sets the pool (benchmarks/gpu/results/planner.md, issue 33)."""
    own = sum(
        r.bytes for r in reserves if r.kind in (ReserveKind.ACTIVATION, ReserveKind.CUDA_GRAPHS)
    )
    return (
        "CUDA graphs on a shared GPU: vLLM's graph estimate there also counts the other "
        "ranks' profile runs and captures, by timing, so the pool may come out up to "
        f"{(sharing - 1) * own / GIB:.1f} GiB smaller than planned; enforce_eager gives a "
        "repeatable pool"
    )


def ranks_per_device(deployment: Deployment) -> int:
    """How many ranks of the deployment run on one physical GPU: nodes of the local transport
    (one machine) that name the same ``CUDA_VISIBLE_DEVICES``; 1 anywhere else."""
    cluster = deployment.cluster
    if cluster.transport is not Transport.LOCAL:
        return 1
    devices = [n.env.get("CUDA_VISIBLE_DEVICES") for n in cluster.nodes]
    named = [d for d in devices if d]
    return max((named.count(d) for d in named), default=1)


def for_cpu(recipe: Recipe) -> bool:
    """The recipe is for vLLM's CPU backend: it sizes the pool as that backend asks
    (``VLLM_CPU_KVCACHE_SPACE``), which no GPU recipe sets."""
    return wire.VLLM_CPU_KVCACHE_SPACE in recipe.env


def infer_hardware(deployment: Deployment, name: str | None) -> HardwareProfile:
    """``--hardware``, else a hint in the cluster (DGX Spark, a GPU profile's name such as
    ``h200`` as a word of the cluster's or a node's name, local CPU), else an error."""
    if name:
        return load_profile(name)
    cluster = deployment.cluster
    words = " ".join([cluster.name, *(n.name for n in cluster.nodes)]).lower()
    if "spark" in words or "gb10" in words:
        return load_profile("gb10")
    named = set(re.split(r"[^a-z0-9]+", words)) & (set(profile_names()) - {"cpu"})
    if len(named) == 1:
        return load_profile(named.pop())
    if for_cpu(deployment.recipe) or (
        cluster.transport is Transport.LOCAL
        and not any("CUDA_VISIBLE_DEVICES" in n.env for n in cluster.nodes)
    ):
        return load_profile("cpu")
    raise PlanError(
        "cannot tell which hardware the cluster has",
        field="--hardware",
        hint=f"pass --hardware {'|'.join(listed_profiles())}",
    )


def _observation_settings(settings: ServeSettings, obs: dict[str, Any]) -> ServeSettings:
    keys = ("gpu_memory_utilization", "max_model_len", "max_num_batched_tokens", "async_scheduling")
    return settings.model_copy(update={k: obs[k] for k in keys if k in obs})


def _shipped_boot(
    facts: ModelFacts, settings: ServeSettings, hardware: HardwareProfile
) -> dict[str, Any] | None:
    for obs in facts.observations:
        if (
            obs.get("kind") == "boot"
            and obs.get("hardware") == hardware.name
            and obs.get("tensor_parallel_size") == settings.tensor_parallel_size
        ):
            return obs
    return None


def plan_for(
    deployment: Deployment,
    *,
    model_dir: Path | None = None,
    config_path: Path | None = None,
    hardware: str | None = None,
    **options: Any,
) -> Plan:
    """Plan a deployment from its own recipe and cluster: the model's facts found where the
    recipe says (or in ``model_dir``), the hardware named (or inferred from the cluster), and
    ``plan_deployment``'s options. What ``tandem plan`` and a launched deployment's status use.

    Raises:
        PlanError: the model's facts are nowhere, no hardware profile fits, or the deployment
            is impossible.
    """
    facts = facts_of(deployment.recipe.model, model_dir=model_dir, config_path=config_path)
    return plan_deployment(deployment, facts, infer_hardware(deployment, hardware), **options)


def plan_deployment(
    deployment: Deployment,
    facts: ModelFacts,
    hardware: HardwareProfile,
    *,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    context_tokens: int = 8192,
    acceptance_rate: float = 0.5,
    concurrency: int | None = None,
    use_shipped_boots: bool = True,
) -> Plan:
    """Plan one deployment. See the module docstring for the steps."""
    recipe = deployment.recipe
    leader_env = {**recipe.env, **deployment.cluster.leader.env}
    settings = resolve_settings(
        recipe.engine.serve,
        leader_env,
        facts.config,
        hardware,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    longest = model_max_len(facts.config)
    allow_long = leader_env.get(wire.VLLM_ALLOW_LONG_MAX_MODEL_LEN) == "1"
    if longest and settings.max_model_len > longest and not allow_long:
        raise PlanError(
            f"max_model_len {settings.max_model_len:,} is beyond the model's longest context "
            f"{longest:,} (config.json of {facts.repo_id}); vLLM refuses to start",
            file=None if max_model_len is not None else deployment.recipe_file,
            field="--max-model-len" if max_model_len is not None else "engine.serve.max_model_len",
            hint=f"use at most {longest:,}, or set env {wire.VLLM_ALLOW_LONG_MAX_MODEL_LEN}: 1 "
            "if you know the model extrapolates",
        )
    ranks = settings.tensor_parallel_size * settings.pipeline_parallel_size
    gpus = sum(n.gpus for n in deployment.cluster.nodes)
    if ranks > gpus and hardware.device == "cuda":
        raise PlanError(
            f"TP x PP = {ranks} devices but the cluster has {gpus}",
            field="engine.serve.tensor_parallel_size",
            file=deployment.recipe_file,
            hint="add nodes to the cluster or lower tensor_parallel_size",
        )
    notes = [f"model facts from {facts.source}", *facts.notes]
    if longest and settings.max_model_len > longest:
        notes.append(
            f"max_model_len {settings.max_model_len:,} is beyond the model's longest "
            f"context {longest:,}, allowed by {wire.VLLM_ALLOW_LONG_MAX_MODEL_LEN}=1: "
            "quality past it is the model's own extrapolation"
        )
    notes += [f"vLLM default assumed: {d}" for d in settings.defaults]

    scale, extra = 1.0, []
    boot = _shipped_boot(facts, settings, hardware) if use_shipped_boots else None
    if boot is not None:
        obs_settings = _observation_settings(settings, boot)
        obs_layout = layout_for(facts, obs_settings)
        measured_pool = boot["available_kv_cache_gib"] * GIB
        scale = boot["kv_cache_tokens"] / obs_layout.pool_tokens(measured_pool)
        obs_memory = memory_plan(facts, obs_settings, hardware)
        measured_non_kv = obs_memory.budget_bytes - measured_pool
        extra = [
            Reserve(
                kind=ReserveKind.CALIBRATED,
                name="unattributed non-KV memory (calibrated)",
                bytes=int(measured_non_kv - obs_memory.non_kv_bytes),
                basis=f"calibrated: measured non-KV memory of a shipped boot minus this "
                f"plan's arithmetic at the same settings ({boot['source']})",
            )
        ]
        notes.append(
            f"calibrated on a measured boot (util {boot['gpu_memory_utilization']}, "
            f"max_model_len {boot['max_model_len']}, {boot['available_kv_cache_gib']} GiB "
            f"-> {boot['kv_cache_tokens']:,} tokens): the layout model gave "
            f"{obs_layout.pool_tokens(measured_pool):,} tokens there, so capacity is "
            f"scaled by {scale:.4f}, and {extra[0].bytes / GIB:+.2f} GiB of non-KV "
            "memory the arithmetic misses is carried as a reserve"
        )

    layout = layout_for(facts, settings)
    memory = memory_plan(facts, settings, hardware, extra)
    sharing = ranks_per_device(deployment)
    if sharing > 1 and hardware.device == "cuda":
        extra = [
            *extra,
            Reserve(
                kind=ReserveKind.PEERS,
                name=f"{sharing - 1} other rank(s) on the same GPU",
                bytes=(sharing - 1) * memory.non_kv_bytes,
                basis="derived: vLLM counts what other processes allocate on its device during its "
                "profile run as its own non-torch memory, and sizes every rank's KV cache "
                "by the smallest rank; so the rank that profiles last loses the others' "
                "weights and reserves (seen on two TP ranks sharing one H200)",
            ),
        ]
        memory = memory_plan(facts, settings, hardware, extra)
        notes.append(
            f"{sharing} ranks share one GPU (same CUDA_VISIBLE_DEVICES on nodes of one "
            "machine): one GPU stands in for several nodes"
        )
        if not settings.enforce_eager:
            notes.append(_shared_graphs_note(memory.reserves, sharing))
    pool_for_tokens = max(memory.kv_pool_bytes, 0) * scale
    tokens = layout.pool_tokens(pool_for_tokens)
    concurrency_x = layout.max_concurrency(pool_for_tokens)
    fit = fit_verdict(
        memory,
        layout,
        settings,
        hardware,
        lambda length: layout_for(facts, settings, length),
        scale,
    )
    notes += layout.notes
    if hardware.device == "cpu":
        notes.append(
            f"CPU backend: the KV pool is VLLM_CPU_KVCACHE_SPACE = "
            f"{settings.cpu_kv_cache_space_gib:g} GiB per worker, as vLLM allocates it"
            if settings.cpu_kv_cache_space_gib is not None
            else "CPU backend without VLLM_CPU_KVCACHE_SPACE: vLLM sizes the pool from the "
            "node's free memory at boot; this plan's pool is a guess. Set it in env."
        )
    if hardware.unified_memory and hardware.device == "cuda" and hardware.outside_budget_gib:
        notes.append(
            f"unified memory: {memory.outside_budget_bytes / GIB:.1f} GiB outside vLLM's budget "
            f"({hardware.outside_budget_gib.source}); per node "
            f"{memory.node_use_bytes / 1e9:.1f} GB in use"
        )
        if hardware.desktop_gui_gib:
            notes.append(
                f"a running desktop GUI takes about {hardware.desktop_gui_gib.value:g} GiB "
                f"more of the same pool ({hardware.desktop_gui_gib.source})"
            )
    roof = roofline(
        facts,
        settings,
        hardware,
        layout,
        context_tokens=context_tokens,
        acceptance_rate=acceptance_rate,
        concurrency=settings.max_num_seqs if concurrency is None else concurrency,
    )
    notes += roof.notes

    kv_per_token = layout.kv_bytes_per_token / scale
    plan = Plan(
        deployment=recipe.name,
        model=facts.repo_id,
        model_source=facts.source,
        hardware=hardware.name,
        nodes=len(deployment.cluster.nodes),
        settings=settings,
        weights_bytes_per_rank=memory.weights_bytes_per_rank,
        weights_gib_per_rank=round(memory.weights_bytes_per_rank / GIB, 3),
        kv_bytes_per_token=round(kv_per_token, 1),
        kv_bytes_per_token_ideal=round(layout.kv_bytes_per_token_ideal, 1),
        kv_bytes_per_token_layout_model=round(layout.kv_bytes_per_token, 1),
        kv_capacity_scale=round(scale, 6),
        kv_pool_bytes=memory.kv_pool_bytes,
        kv_pool_gib=round(memory.kv_pool_bytes / GIB, 3),
        kv_pool_tokens=tokens,
        max_concurrency=round(concurrency_x, 4),
        max_model_len_tokens=settings.max_model_len,
        fits=fit.fits,
        per_node_memory_bytes=memory.node_use_bytes,
        per_node_memory_gb=round(memory.node_use_bytes / 1e9, 2),
        decode_roofline_tok_s=round(roof.single_stream.decode_tok_s, 2),
        decode_roofline_at_concurrency_tok_s=round(roof.at_concurrency.decode_tok_s, 2),
        memory=memory,
        kv=layout,
        fit=fit,
        roofline=roof,
        notes=notes,
        explanations=[],
    )
    plan.explanations = [
        explain_claim(obs, plan, facts, hardware, deployment)
        for obs in facts.observations
        if obs.get("kind") == "claim"
        and obs.get("hardware") == hardware.name
        and obs.get("gpu_memory_utilization") == settings.gpu_memory_utilization
    ]
    return plan


def explain_claim(
    obs: dict[str, Any],
    plan: Plan,
    facts: ModelFacts,
    hardware: HardwareProfile,
    deployment: Deployment,
) -> Explanation:
    """Why a reported KV figure differs from this plan: the pool it implies, and what gives it."""
    claimed = obs.get("kv_cache_tokens")
    per_token = plan.kv_bytes_per_token
    if obs.get("max_model_len") and obs["max_model_len"] != plan.max_model_len_tokens:
        other = plan_deployment(
            deployment,
            facts,
            hardware,
            max_model_len=obs["max_model_len"],
            gpu_memory_utilization=obs["gpu_memory_utilization"],
        )
        per_token, planned_tokens = other.kv_bytes_per_token, other.kv_pool_tokens
    else:
        planned_tokens = plan.kv_pool_tokens
    implied = claimed * per_token if claimed else None
    util = extra = None
    if implied is not None:
        util = round((implied + plan.memory.non_kv_bytes) / plan.memory.memory_total_bytes, 3)
        extra = round((plan.kv_pool_bytes - implied) / GIB, 2)
    diff = round((planned_tokens - claimed) / claimed * 100, 1) if claimed else 0.0
    text = (
        f"{obs['source']} reports {claimed:,} tokens at util {obs['gpu_memory_utilization']}; "
        f"this plan gives {planned_tokens:,} ({diff:+.1f}%). At {per_token:,.0f} B per "
        f"reported token, {claimed:,} tokens need a {implied / GIB:.2f} GiB pool, which this "
        f"plan reaches at util {util}, not {obs['gpu_memory_utilization']}: either the run "
        f"used a lower utilization (MiaAI's util 0.80 boot logged 12.94 GiB -> ~1.79M), or "
        f"about {extra:.1f} GiB more non-KV memory was in use (larger CUDA-graph captures, "
        f"sidecars, other buffers). The figures are consistent with ~7.8-9 KB per token, not "
        f"with util {obs['gpu_memory_utilization']} on this build."
        if implied is not None
        else f"{obs['source']}: no token figure to compare"
    )
    return Explanation(
        claim=f"{claimed:,} tokens at util {obs['gpu_memory_utilization']}" if claimed else "",
        source=obs["source"],
        claimed_kv_pool_tokens=claimed,
        planned_kv_pool_tokens=planned_tokens,
        difference_pct=diff,
        implied_kv_pool_gib=round(implied / GIB, 3) if implied else None,
        equivalent_gpu_memory_utilization=util,
        extra_non_kv_gib=extra,
        text=text,
    )
