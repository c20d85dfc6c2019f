"""Decode roofline: an upper bound on tokens/s from the bytes each decode step must read.

One decode step of one rank reads, at best once each:

    non-expert weights   (attention, shared experts, dense MLPs, LM head) / TP, replicated whole
    routed experts       E_distinct(n) distinct experts per MoE layer, E(n) = E x (1-(1-k/E)^n)
                         for n tokens in the step if routing were independent (pessimistic)
    drafter              the speculative drafter's active bytes / TP
    KV cache             the context each sequence attends to (DeepSeek-V4: sparse top-k, the
                         indexer scan and the compressed layers)

    t_step = bytes / bandwidth + all-reduces x latency   (2 all-reduces per layer when TP > 1)
    tok/s  = concurrency x tau / t_step,   tau = 1 + k x acceptance   (k draft tokens)

The bound ignores compute, kernel efficiency and scheduler time: measured decode on 2x GB10 is
60-76% of it (model-physics.md §5.3).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tandem.plan.config import ModelFacts
from tandem.plan.estimate import routed_experts
from tandem.plan.hardware import HardwareProfile
from tandem.plan.kv import V4_RECORD_BYTES, KVLayout, is_deepseek_v4, layer_kinds
from tandem.plan.memory import ServeSettings, uses_drafter


class RooflinePoint(BaseModel):
    """The bound at one concurrency."""

    concurrency: int
    tokens_per_step: int = Field(description="Tokens verified per sequence per step (k + 1).")
    distinct_experts_per_layer: float
    bytes_per_step_per_rank: int
    weight_bytes_per_step_per_rank: int
    kv_bytes_per_step_per_rank: int
    allreduce_s_per_step: float
    step_s: float
    steps_per_s: float
    decode_tok_s: float = Field(description="Upper bound, all sequences together.")


class Roofline(BaseModel):
    """Decode bounds, single stream and at the requested concurrency."""

    context_tokens: int
    memory_bandwidth_bytes_per_s: float
    draft_tokens: int
    acceptance_rate: float
    tau: float = Field(description="Tokens accepted per sequence per step, 1 + k x acceptance.")
    single_stream: RooflinePoint
    at_concurrency: RooflinePoint
    notes: list[str] = Field(default_factory=list)


def distinct_experts(n_tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts hit by ``n_tokens`` tokens under independent routing."""
    if experts == 0:
        return 0.0
    return experts * (1 - (1 - top_k / experts) ** n_tokens)


def kv_read_bytes(config: dict, layout: KVLayout, context: int) -> float:
    """KV bytes one sequence's decode step reads on one rank at ``context`` tokens."""
    if is_deepseek_v4(config):
        layers = int(config["num_hidden_layers"])
        ratios = [int(r) for r in config["compress_ratios"][:layers]]
        window = int(config.get("sliding_window", 128))
        topk = int(config.get("index_topk", 512))
        index_dim = int(config.get("index_head_dim", 128))
        index_bytes = index_dim + index_dim // 128 * 4
        swa = min(window, context) * V4_RECORD_BYTES
        total = 0.0
        for r in ratios:
            if r == 4:
                total += min(topk, context / 4) * V4_RECORD_BYTES + swa + context / 4 * index_bytes
            elif r == 128:
                total += context / 128 * V4_RECORD_BYTES + swa
            else:
                total += swa
        return total
    window = int(config.get("sliding_window") or 0)
    kinds = layer_kinds(config)
    per_layer = layout.kv_bytes_per_token_ideal / max(len(kinds), 1)
    return sum(per_layer * (min(window, context) if k == "sliding" else context) for k in kinds)


def roofline(
    facts: ModelFacts,
    settings: ServeSettings,
    hardware: HardwareProfile,
    layout: KVLayout,
    *,
    context_tokens: int,
    acceptance_rate: float,
    concurrency: int,
) -> Roofline:
    """Decode bounds for one sequence and for ``concurrency`` sequences."""
    tp = settings.tensor_parallel_size
    config = facts.config
    bandwidth = hardware.memory_bandwidth_gb_s.value * 1e9
    experts, top_k = routed_experts(config), int(config.get("num_experts_per_tok") or 0)
    roles = ("attention", "shared_experts", "dense_mlp", "lm_head", "other")
    non_expert = sum(
        (p.bytes - p.replicated_bytes) / tp + p.replicated_bytes
        for p in facts.parts
        if p.role in roles
    )
    if not any(p.role == "lm_head" for p in facts.parts):
        non_expert += facts.part_bytes("embedding") / tp  # tied embeddings serve as the LM head
    routed = facts.part_bytes("routed_experts")
    per_expert = routed / experts / tp if experts else 0.0
    k = settings.num_speculative_tokens
    drafting = (
        [p for p in facts.parts if p.role == "drafter"] if k and uses_drafter(settings) else []
    )
    drafter = sum(((p.active_bytes_per_step or p.bytes) / tp for p in drafting), 0.0)
    tau = 1 + k * acceptance_rate
    layers = int(config.get("num_hidden_layers", 0))
    allreduce = (2 * layers * hardware.allreduce_latency_us.value * 1e-6) if tp > 1 else 0.0
    kv_one = kv_read_bytes(config, layout, min(context_tokens, settings.max_model_len))

    def point(n_seqs: int) -> RooflinePoint:
        tokens = n_seqs * (k + 1)
        hit = distinct_experts(tokens, experts, top_k)
        weight_bytes = non_expert + hit * per_expert + drafter
        kv = kv_one * n_seqs
        step = (weight_bytes + kv) / bandwidth + allreduce
        return RooflinePoint(
            concurrency=n_seqs,
            tokens_per_step=k + 1,
            distinct_experts_per_layer=round(hit, 2),
            bytes_per_step_per_rank=int(weight_bytes + kv),
            weight_bytes_per_step_per_rank=int(weight_bytes),
            kv_bytes_per_step_per_rank=int(kv),
            allreduce_s_per_step=allreduce,
            step_s=step,
            steps_per_s=1 / step,
            decode_tok_s=n_seqs * tau / step,
        )

    notes = [
        f"bandwidth {hardware.memory_bandwidth_gb_s.value:g} GB/s "
        f"({hardware.memory_bandwidth_gb_s.source})"
    ]
    if experts:
        notes.append(
            f"MoE: {experts} experts, top-{top_k}; distinct experts per step assume "
            "independent routing (pessimistic)"
        )
    if k:
        notes.append(
            f"speculation: {k} draft tokens, acceptance {acceptance_rate} (an input: "
            f"--acceptance), tau = {tau:.2f} tokens per step"
        )
    if tp > 1:
        notes.append(
            f"all-reduce: 2 x {layers} layers x "
            f"{hardware.allreduce_latency_us.value:g} us = {allreduce * 1e3:.2f} ms per step"
        )
    return Roofline(
        context_tokens=context_tokens,
        memory_bandwidth_bytes_per_s=bandwidth,
        draft_tokens=k,
        acceptance_rate=acceptance_rate,
        tau=tau,
        single_stream=point(1),
        at_concurrency=point(max(concurrency, 1)),
        notes=notes,
    )
