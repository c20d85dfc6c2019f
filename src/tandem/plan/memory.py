"""Memory of one rank: weights, vLLM's budget, the reserves, the KV pool, and the fit verdict.

The arithmetic follows vLLM's own accounting (``vllm/v1/worker/gpu_worker.py``):

    requested = ceil(total_memory x gpu_memory_utilization)
    kv_pool   = requested - weights - activation peak - non-torch - CUDA graphs

On the CPU backend the pool is not derived: every worker allocates ``VLLM_CPU_KVCACHE_SPACE``
GiB. On unified memory (GB10) the OS, page cache and CUDA context sit outside the budget but in
the same pool, so a node uses ``requested + outside`` and that must fit the node.

Weights per rank: what TP splits is divided by TP (and by PP for the layers), what every rank
holds whole (norms, routers, MLA down-projections) is added in full. Drafter/MTP weights count
only when the recipe speculates with them. Reserves other than weights are estimates and are
labelled so; where a measured boot of the same model ships with tandem, the difference between
its measured non-KV memory and this arithmetic is carried as a calibrated reserve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from tandem.errors import PlanError
from tandem.plan.config import ModelFacts
from tandem.plan.hardware import Figure, HardwareProfile
from tandem.plan.kv import KVLayout, default_block_size, is_deepseek_v4, kv_layout
from tandem.plan.profile_run import (
    ProfileSettings,
    activation_peak,
    cudagraph_estimate,
    v2_model_runner,
)

GIB = 1024**3
# Activation peak of the profile run, bytes per batched token per hidden unit: 2.03 GiB at
# 8192 tokens x hidden 4096 in a GB10 DeepSeek-V4 TP4 boot log (model-physics.md §2.4, [R11]).
ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN = 65.0


class ServeSettings(BaseModel):
    """The serve options that shape memory, with vLLM's defaults filled in."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    expert_parallel: bool = False
    gpu_memory_utilization: float
    max_model_len: int
    block_size: int
    kv_cache_dtype: str | None
    max_num_batched_tokens: int
    max_num_seqs: int
    async_scheduling: bool
    enforce_eager: bool
    speculative_method: str | None
    num_speculative_tokens: int
    cpu_kv_cache_space_gib: float | None
    defaults: list[str] = Field(
        default_factory=list, description="Which values are vLLM defaults rather than the recipe's."
    )

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens scheduled but not settled: one batch per concurrent step (async: two)."""
        batches = (
            2
            if self.async_scheduling and self.pipeline_parallel_size == 1
            else self.pipeline_parallel_size
        )
        return batches * self.max_num_batched_tokens


def resolve_settings(
    serve: Any,
    env: dict[str, str],
    config: dict[str, Any],
    hardware: HardwareProfile,
    *,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
) -> ServeSettings:
    """Fill the recipe's unset serve options with what vLLM would use on ``hardware``."""
    defaults = []
    tp, pp = serve.tensor_parallel_size, serve.pipeline_parallel_size
    length = max_model_len if max_model_len is not None else serve.max_model_len
    if length is None:
        length = model_max_len(config) or 4096
        defaults.append(f"max_model_len {length} (the model's longest context)")
    util = (
        gpu_memory_utilization
        if gpu_memory_utilization is not None
        else serve.gpu_memory_utilization
    )
    if util is None:
        util = 0.92
        defaults.append("gpu_memory_utilization 0.92 (vLLM's default)")
    block = serve.block_size
    if block is None or is_deepseek_v4(config):
        default, why = default_block_size(config, hardware.device)
        if hardware.mla_block_size and "kv_lora_rank" in config and not is_deepseek_v4(config):
            default, why = int(hardware.mla_block_size.value), hardware.mla_block_size.source
        if block is None:
            defaults.append(f"block_size {default} ({why})")
        block = default
    elif hardware.device == "cpu" and "kv_lora_rank" in config:
        block = 16
    batched = serve.max_num_batched_tokens
    if batched is None and hardware.default_max_num_batched_tokens:
        batched = int(hardware.default_max_num_batched_tokens.value)
        defaults.append(
            f"max_num_batched_tokens {batched} ({hardware.default_max_num_batched_tokens.source})"
        )
    if batched is None:
        batched = 2048 * tp * pp if hardware.device == "cpu" else 2048
        if hardware.device == "cpu" and "kv_lora_rank" in config:
            batched = max(length, 8192)
        defaults.append(f"max_num_batched_tokens {batched} (vLLM's API-server default)")
    seqs = serve.max_num_seqs
    if seqs is None:
        seqs = int(hardware.default_max_num_seqs.value) if hardware.default_max_num_seqs else 256
    async_scheduling = serve.async_scheduling
    if async_scheduling is None:
        async_scheduling = hardware.device == "cuda"
    spec = serve.speculative_config or {}
    space = None
    if hardware.kv_cache_space_env and env.get(hardware.kv_cache_space_env):
        space = float(env[hardware.kv_cache_space_env])
    return ServeSettings(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        expert_parallel=serve.enable_expert_parallel,
        gpu_memory_utilization=util,
        max_model_len=length,
        block_size=block,
        kv_cache_dtype=serve.kv_cache_dtype,
        max_num_batched_tokens=batched,
        max_num_seqs=seqs,
        async_scheduling=async_scheduling,
        enforce_eager=serve.enforce_eager,
        speculative_method=spec.get("method"),
        num_speculative_tokens=int(spec.get("num_speculative_tokens", 0) or 0),
        cpu_kv_cache_space_gib=space,
        defaults=defaults,
    )


def model_max_len(config: dict[str, Any]) -> int | None:
    """The longest context the model takes, as vLLM derives it (``_get_and_verify_max_len``):
    ``max_position_embeddings``, scaled by a RoPE scaling ``factor`` (from
    ``original_max_position_embeddings`` for yarn; not for su, longrope, llama3). None when the
    config does not say."""
    length = config.get("max_position_embeddings")
    if not isinstance(length, int):
        return None
    rope = config.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type")
    factor = rope.get("factor")
    if isinstance(factor, int | float) and kind not in ("su", "longrope", "llama3", None):
        base = rope.get("original_max_position_embeddings", length) if kind == "yarn" else length
        length = max(length, int(base * factor))
    return length


class ReserveKind(StrEnum):
    """What a reserve is, for the code that picks some out (a rank's own transient memory on a
    shared GPU, a benchmark's term-by-term table); the name is for people."""

    ACTIVATION = "activation"
    """The profile run's torch peak."""
    NON_TORCH = "non-torch"
    """NCCL, cuBLAS and the CUDA context outside torch's allocator."""
    CUDA_GRAPHS = "cuda-graphs"
    MODEL_BUFFER = "model-buffer"
    """A model's own buffer outside its weights (a gather workspace, a drafter's hidden)."""
    CALIBRATED = "calibrated"
    """What a measured boot shows and the arithmetic misses."""
    PEERS = "peers"
    """Other ranks on the same GPU."""


class Reserve(BaseModel):
    """One slice of vLLM's budget that is not weights and not KV."""

    kind: ReserveKind
    name: str
    bytes: int
    basis: str = Field(description="`estimate`, `measured` or `calibrated`, and from what.")


class MemoryPlan(BaseModel):
    """One rank's memory, in bytes."""

    memory_total_bytes: int
    budget_bytes: int = Field(description="ceil(total x gpu_memory_utilization): vLLM's budget.")
    weights_bytes_per_rank: int
    weights_replicated_bytes_per_rank: int
    reserves: list[Reserve]
    kv_pool_bytes: int
    outside_budget_bytes: int = Field(
        description="Unified memory: OS, page cache and CUDA "
        "context in the same pool, outside vLLM's budget."
    )
    node_use_bytes: int = Field(
        description="What one node uses: budget plus outside (UMA), else the budget."
    )

    @property
    def non_kv_bytes(self) -> int:
        """Weights and reserves: what the budget holds before any KV cache."""
        return self.weights_bytes_per_rank + sum(r.bytes for r in self.reserves)


def weights_per_rank(facts: ModelFacts, settings: ServeSettings) -> tuple[int, int]:
    """(bytes per rank, of which replicated): TP/PP split, replicated parts whole."""
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    total = replicated = 0.0
    for part in facts.parts:
        if part.role == "drafter" and not uses_drafter(settings):
            continue
        split = part.bytes - part.replicated_bytes
        total += split / (tp * pp) + part.replicated_bytes / pp
        replicated += part.replicated_bytes / pp
    return math.ceil(total), math.ceil(replicated)


def uses_drafter(settings: ServeSettings) -> bool:
    """True when the speculative method runs the checkpoint's own MTP/drafter layers."""
    method = (settings.speculative_method or "").lower()
    return any(m in method for m in ("mtp", "dspark"))


def reserves_for(
    facts: ModelFacts, settings: ServeSettings, hardware: HardwareProfile
) -> list[Reserve]:
    """Activation, non-torch, CUDA-graph and model-specific buffers (estimates, labelled)."""
    config = facts.config
    hidden = int(config.get("hidden_size", 0))
    batched = settings.max_num_batched_tokens
    derived = hardware.activation == "derived"
    if derived:
        reserves = [derived_activation(config, settings, hardware)]
    else:
        reserves = [
            Reserve(
                kind=ReserveKind.ACTIVATION,
                name="activation peak (profile run)",
                bytes=int(batched * hidden * ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN),
                basis=f"estimate: {batched} batched tokens x hidden {hidden} x "
                f"{ACTIVATION_BYTES_PER_TOKEN_PER_HIDDEN:.0f} B, scaled from 2.03 GiB measured "
                "for DeepSeek-V4 on GB10 (model-physics.md §2.4, [R11])",
            )
        ]
    if hardware.non_torch_gib:
        reserves.append(
            _profile_reserve(
                ReserveKind.NON_TORCH, "non-torch (NCCL, cuBLAS)", hardware.non_torch_gib
            )
        )
    if hardware.non_torch_tp_extra_gib and settings.tensor_parallel_size > 1:
        name = "non-torch, TP > 1 (NCCL communicator)"
        reserves.append(
            _profile_reserve(ReserveKind.NON_TORCH, name, hardware.non_torch_tp_extra_gib)
        )
    # vLLM's V2 model runner captures its graphs after sizing the KV cache: nothing reserved.
    discrete_cuda = hardware.device == "cuda" and not hardware.unified_memory
    if not settings.enforce_eager and not (discrete_cuda and v2_model_runner(config)):
        if derived:
            reserves.append(derived_cudagraphs(config, settings))
        elif hardware.cudagraph_gib:
            reserves.append(
                _profile_reserve(ReserveKind.CUDA_GRAPHS, "CUDA graphs", hardware.cudagraph_gib)
            )
    if is_deepseek_v4(config):
        window = int(config.get("sliding_window", 128))
        workspace = 4 * (settings.max_model_len // 4 + window + batched) * 512 * 2
        reserves.append(
            Reserve(
                kind=ReserveKind.MODEL_BUFFER,
                name="DeepSeek-V4 prefill gather workspace",
                bytes=workspace,
                basis="derived: 4 x (max_model_len/4 + window + batched tokens) x 512 x 2 B "
                "(model-physics.md §1.2, [R3])",
            )
        )
        if uses_drafter(settings):
            reserves.append(
                Reserve(
                    kind=ReserveKind.MODEL_BUFFER,
                    name="MTP hidden buffer",
                    bytes=batched * int(config.get("hc_mult", 4)) * hidden * 2,
                    basis="derived: batched tokens x hc_mult x hidden x 2 B "
                    "(model-physics.md §1.2)",
                )
            )
    return reserves


def _profile_settings(settings: ServeSettings) -> ProfileSettings:
    """The serve settings the profile run reads: ``ProfileSettings``' fields, by their names."""
    return ProfileSettings.model_validate(settings, from_attributes=True)


def derived_activation(
    config: dict[str, Any], settings: ServeSettings, hardware: HardwareProfile
) -> Reserve:
    """The profile run's torch peak, walked the way vLLM allocates it (``plan.profile_run``)."""
    if hardware.sm_count is None:
        raise PlanError(
            f"hardware profile {hardware.name} derives the activation peak but has no sm_count",
            field="sm_count",
            hint="add the device's streaming-multiprocessor count (vLLM's sampler sizes a "
            "buffer by it) to the profile",
        )
    peak = activation_peak(config, _profile_settings(settings), int(hardware.sm_count.value))
    parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in peak.parts.items() if v >= GIB // 100)
    unprobed = (
        " (DeepSeek-V4's attention not probed: walked as GQA)" if is_deepseek_v4(config) else ""
    )
    return Reserve(
        kind=ReserveKind.ACTIVATION,
        name="activation peak (profile run)",
        bytes=peak.bytes,
        basis=f"derived: vLLM's profile run of {settings.max_num_batched_tokens} tokens, "
        f"{settings.max_num_seqs} seqs; peak at {peak.moment}: {parts} GiB{unprobed} "
        "(plan/profile_run.py, benchmarks/gpu/results/planner.md)",
    )


def derived_cudagraphs(config: dict[str, Any], settings: ServeSettings) -> Reserve:
    """vLLM 0.25.1's own CUDA-graph estimate on the V1 runner, subtracted before the KV cache."""
    graphs = cudagraph_estimate(config, _profile_settings(settings))
    return Reserve(
        kind=ReserveKind.CUDA_GRAPHS,
        name="CUDA graphs (vLLM's estimate, V1 runner)",
        bytes=graphs.bytes,
        basis=f"derived: max(first PIECEWISE capture {graphs.piecewise_first_bytes / GIB:.2f}, "
        f"first FULL capture {graphs.full_first_bytes / GIB:.2f}) GiB + "
        f"{graphs.piecewise_graphs - 1} x 2 MiB + {graphs.full_graphs - 1} x 1 MiB; the "
        "PIECEWISE pool calibrated (GPUModelRunner.profile_cudagraph_memory; "
        "plan/profile_run.py)",
    )


def _profile_reserve(kind: ReserveKind, name: str, figure: Figure) -> Reserve:
    """A reserve the hardware profile states in GiB, its basis the figure's own source
    (labelled ``source:`` unless it already says estimate, measured or derived)."""
    head = figure.source.split(":", 1)[0].strip().lower()
    labelled = head in ("estimate", "measured", "derived")
    basis = figure.source if labelled else f"source: {figure.source}"
    return Reserve(kind=kind, name=name, bytes=int(figure.value * GIB), basis=basis)


def memory_plan(
    facts: ModelFacts,
    settings: ServeSettings,
    hardware: HardwareProfile,
    extra_reserves: Sequence[Reserve] = (),
) -> MemoryPlan:
    """Budget, weights, reserves and KV pool of one rank."""
    total = int(hardware.memory_total_gib.value * GIB)
    weights, replicated = weights_per_rank(facts, settings)
    reserves: list[Reserve] = []  # vLLM's CPU backend reserves nothing beside the pool
    outside = 0
    if hardware.device == "cpu" and settings.cpu_kv_cache_space_gib is not None:
        pool = int(settings.cpu_kv_cache_space_gib * GIB)
        budget = pool + weights
    elif hardware.device == "cpu":
        budget = math.ceil(total * settings.gpu_memory_utilization)
        pool = budget - weights
    else:
        outside = int(hardware.outside_budget_gib.value * GIB) if hardware.outside_budget_gib else 0
        budget = math.ceil(total * settings.gpu_memory_utilization)
        reserves = reserves_for(facts, settings, hardware) + list(extra_reserves)
        pool = budget - weights - sum(r.bytes for r in reserves)
    return MemoryPlan(
        memory_total_bytes=total,
        budget_bytes=budget,
        weights_bytes_per_rank=weights,
        weights_replicated_bytes_per_rank=replicated,
        reserves=reserves,
        kv_pool_bytes=pool,
        outside_budget_bytes=outside,
        node_use_bytes=budget + (outside if hardware.unified_memory else 0),
    )


def layout_for(
    facts: ModelFacts, settings: ServeSettings, max_model_len: int | None = None
) -> KVLayout:
    return kv_layout(
        facts.config,
        kv_cache_dtype=settings.kv_cache_dtype,
        block_size=settings.block_size,
        max_model_len=max_model_len or settings.max_model_len,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        max_in_flight_tokens=settings.max_in_flight_tokens,
    )


class Fit(BaseModel):
    """Whether the deployment fits, by how much, and what to change if it does not."""

    fits: bool
    reasons: list[str] = Field(default_factory=list, description="Why it does not fit.")
    kv_headroom_bytes: int = Field(description="KV pool left after one max-length request.")
    node_headroom_bytes: int = Field(description="Node memory left after budget and outside use.")
    largest_max_model_len_tokens: int = Field(
        description="Longest max_model_len one request fits at this utilization."
    )
    min_gpu_memory_utilization: float | None = Field(
        description="Smallest utilization that holds one max-length request."
    )
    max_gpu_memory_utilization: float | None = Field(
        description="Largest utilization the node allows (unified memory) or 1.0."
    )
    changes: list[str] = Field(default_factory=list, description="What to change to fit.")


def fit_changes(
    memory: MemoryPlan,
    settings: ServeSettings,
    *,
    one_request: float,
    largest: int,
    util_range: tuple[float | None, float | None],
) -> list[str]:
    """What to change so that a plan that does not fit does: each line names the setting, its
    value now, the value to set (in the direction that fixes the fault) and why; a setting
    already where it would go is not named.

    The utilization a GPU needs lies between ``min_util`` (the weights, reserves and one
    request of ``max_model_len``) and ``max_util`` (what the device starts with). On the CPU
    backend the pool is ``VLLM_CPU_KVCACHE_SPACE``, so that is the setting to raise.
    """
    min_util, max_util = util_range
    util = settings.gpu_memory_utilization
    changes = []
    kv_short = memory.kv_pool_bytes < one_request
    if max_util is not None and util > max_util + 1e-9:
        changes.append(
            f"set gpu_memory_utilization to {max_util} or lower (it is {util}; this hardware "
            f"starts with at most {max_util})"
        )
    elif kv_short and min_util is not None and max_util is not None and min_util <= max_util:
        changes.append(
            f"raise gpu_memory_utilization from {util} to at least {min_util} (at most "
            f"{max_util}): the weights, reserves and one {settings.max_model_len:,}-token "
            "request then fit"
        )
    if kv_short and settings.cpu_kv_cache_space_gib is not None:
        need = math.ceil(one_request / GIB * 10) / 10
        changes.append(
            f"raise VLLM_CPU_KVCACHE_SPACE from {settings.cpu_kv_cache_space_gib:g} to at least "
            f"{need:g} GiB (one {settings.max_model_len:,}-token request), or lower max_model_len"
        )
    if kv_short and 0 < largest < settings.max_model_len:
        changes.append(
            f"or lower max_model_len from {settings.max_model_len:,} to {largest:,} (the "
            "longest request the pool holds now)"
            if changes
            else f"lower max_model_len from {settings.max_model_len:,} to {largest:,} (the "
            "longest request the pool holds)"
        )
    node_short = memory.node_use_bytes - memory.memory_total_bytes
    if node_short > 0 and not (max_util is not None and util > max_util + 1e-9):
        if settings.cpu_kv_cache_space_gib is not None:
            changes.append(
                f"the node is {node_short / GIB:.2f} GiB short: lower VLLM_CPU_KVCACHE_SPACE "
                f"from {settings.cpu_kv_cache_space_gib:g} GiB by that much, or spread the "
                "model over more nodes"
            )
        else:
            lower = math.floor((util - node_short / memory.memory_total_bytes) * 1000) / 1000
            changes.append(
                f"lower gpu_memory_utilization from {util} to {lower} or less (the node is "
                f"{node_short / GIB:.2f} GiB short)"
                if lower > 0
                else f"the node is {node_short / GIB:.2f} GiB short: spread the model over "
                "more nodes (tensor_parallel_size) or use a smaller quantization"
            )
    fixable = any(c.startswith(("set ", "raise ", "lower ")) for c in changes)
    if not fixable or (
        memory.kv_pool_bytes <= 0 and (min_util is None or max_util is None or min_util > max_util)
    ):
        changes.append(
            "raise tensor_parallel_size or pipeline_parallel_size (more nodes) or use a "
            "smaller quantization: the weights leave no room at any setting"
            if memory.kv_pool_bytes <= 0
            else "raise tensor_parallel_size or pipeline_parallel_size (more nodes), or use a "
            "smaller quantization or KV cache dtype"
        )
    return changes


def fit_verdict(
    memory: MemoryPlan,
    layout: KVLayout,
    settings: ServeSettings,
    hardware: HardwareProfile,
    relayout,
    capacity_scale: float = 1.0,
) -> Fit:
    """The verdict, with the largest max_model_len and the utilization range that fit."""
    one_request = layout.bytes_per_request / capacity_scale
    reasons, changes = [], []
    if memory.kv_pool_bytes <= 0:
        non_kv_gib = memory.non_kv_bytes / GIB
        reasons.append(
            f"weights and reserves ({non_kv_gib:.2f} GiB) exceed vLLM's budget "
            f"({memory.budget_bytes / GIB:.2f} GiB)"
        )
    elif memory.kv_pool_bytes < one_request:
        reasons.append(
            f"the KV pool ({memory.kv_pool_bytes / GIB:.2f} GiB) holds less than one "
            f"{settings.max_model_len}-token request ({one_request / GIB:.2f} GiB)"
        )
    node_headroom = memory.memory_total_bytes - memory.node_use_bytes
    if node_headroom < 0:
        reasons.append(
            f"the node needs {memory.node_use_bytes / GIB:.2f} GiB of "
            f"{memory.memory_total_bytes / GIB:.2f} GiB (budget plus what runs outside)"
        )
    max_util = min_util = None
    if hardware.device == "cuda":
        needed = memory.non_kv_bytes + one_request
        min_util = math.ceil(needed / memory.memory_total_bytes * 1000) / 1000
        max_util = 1.0
        if hardware.max_gpu_memory_utilization:
            max_util = hardware.max_gpu_memory_utilization.value
        elif hardware.unified_memory:
            max_util = (
                memory.memory_total_bytes - memory.outside_budget_bytes
            ) / memory.memory_total_bytes
        if settings.gpu_memory_utilization > max_util + 1e-9:
            why = (
                hardware.max_gpu_memory_utilization.source
                if hardware.max_gpu_memory_utilization
                else "unified memory"
            )
            reasons.append(
                f"gpu_memory_utilization {settings.gpu_memory_utilization} is above the "
                f"{max_util} this hardware starts with ({why})"
            )
    pool = max(memory.kv_pool_bytes, 0) * capacity_scale
    largest = layout.largest_max_model_len(pool, relayout)
    fits = not reasons
    if not fits:
        changes = fit_changes(
            memory,
            settings,
            one_request=one_request,
            largest=largest,
            util_range=(min_util, max_util),
        )
    return Fit(
        fits=fits,
        reasons=reasons,
        kv_headroom_bytes=int(memory.kv_pool_bytes - one_request),
        node_headroom_bytes=node_headroom,
        largest_max_model_len_tokens=largest,
        min_gpu_memory_utilization=min_util,
        max_gpu_memory_utilization=max_util,
        changes=changes,
    )
