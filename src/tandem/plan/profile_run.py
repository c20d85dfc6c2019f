"""What vLLM 0.25.1 takes out of the KV budget before sizing the cache on one CUDA rank, beyond
the weights: the torch peak of its profile run, and (V1 model runner only) its estimate of the
CUDA-graph pool. Both derived from the model's shape, the way vLLM's code allocates them.

**Which runner.** ``VllmConfig.use_v2_model_runner`` (``vllm/config/vllm.py``): every dense
generate model and three MoE architectures run on the V2 runner (``vllm/v1/worker/gpu/
model_runner.py``), other MoE models on the V1 runner (``vllm/v1/worker/gpu_model_runner.py``).

**The activation peak** (``Worker.determine_available_memory``, ``vllm/v1/worker/gpu_worker.py``)
is torch's ``allocated_bytes.all.peak`` during ``profile_run`` above what was allocated before:
one forward pass of ``max_num_batched_tokens`` tokens split over ``min(tokens, max_num_seqs)``
requests, with no attention metadata, then the sampler on one row per request. The forward is
walked layer by layer; at each moment the live bytes are what the code holds then:

- *persistent*, allocated during the run and kept: cuBLAS's 32 MiB workspace (at the first GEMM),
  the fused-MoE workspace (``WorkspaceManager``, ``vllm/v1/worker/workspace.py``, from the first
  MoE layer on, sized by ``TritonExperts.workspace_shapes`` in ``fused_moe/experts/
  triton_moe.py``), the Triton top-k/top-p buffer (``topk_topp_triton.py``);
- *attention*: with no metadata, MLA's ``MLAAttention.forward_impl`` (``model_executor/layers/
  attention/mla_attention.py``) still allocates the up-projected chunked-prefill context,
  ``workspace tokens x heads x (qk_nope + v) x 2 B``, "to simulate the worst case" (4 GiB for
  DeepSeek-V3's 128 heads at 8,192 tokens); beside it, the query, the output and, in eager mode,
  the projections' intermediates. torch.compile's piecewise graphs end at the attention op,
  so compiled, only the op's inputs and the residual are live. GQA attention is skipped and
  returns zeros; its q/k/v, output and o_proj output are live;
- *MLP*: a dense layer holds the residual, its input, gate/up, the activation and the down
  projection's output at once (``LlamaMLP.forward`` keeps gate/up bound); a MoE layer four
  hidden-sized buffers (residual, input, the routed output and its copy out of the workspace),
  two more with shared experts (their output and the sum);
- *sampler*: the logits in bf16 and, on the V1 runner, three fp32 copies (``Sampler.forward``,
  ``TopKTopPSampler.forward_native``, the exponential noise of ``random_sample``); the V2
  runner's sampler makes one fp32 copy (``vllm/v1/worker/gpu/sample/sampler.py``).

The peak is the largest of these moments. Checked against torch's memory history around vLLM's
own profile run on the H200 (benchmarks/gpu/vllm_probe.py, ``benchmarks/gpu/results/
planner.md``): DeepSeek-V3 (4 and 5 layers), Qwen3-30B-A3B, Mixtral-8x7B, Llama-3.1-8B and
Gemma-3-4B shapes, eager: each peak within 10 MiB of this walk.

**The CUDA-graph estimate** (``GPUModelRunner.profile_cudagraph_memory``, V1 runner; the V2
runner's returns 0 and captures after the cache is sized): for each graph mode, the device
memory the largest capture took, plus the second capture's times the other graphs; the modes
share one pool, so the largest first capture counts once. The FULL (uniform decode) first
capture is dominated by FlashAttention 3's split-KV accumulators, fp32 ``[splits, tokens,
heads, head_dim_v]`` with ``flash_attn_max_num_splits_for_cuda_graph`` = 32 splits
(``vllm/config/attention.py``; ``v1/attention/backends/mla/flashattn_mla.py``,
``flash_attn.py``): 2 GiB for DeepSeek-V3 at 256 decode tokens (head_dim_v is MLA's 512-wide
latent), 128 MiB for a GQA model of 32 heads of 128.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tandem.plan.estimate import routed_experts

MIB = 1024**2

# vLLM 0.25.1 (config/vllm.py DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES): MoE architectures that run
# on the V2 model runner all the same.
V2_RUNNER_MOE_ARCHITECTURES = (
    "DeepseekV2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "GraniteMoeForCausalLM",
)
CUBLAS_WORKSPACE_BYTES = 32 * MIB
"""torch's cuBLAS(Lt) workspace on Hopper, allocated through its caching allocator at the first
GEMM (measured: 32.0 MiB at the first linear layer of every probed profile run)."""
MLA_WORKSPACE_MAX_TOKENS = 64 * 1024
"""``MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size``'s cap."""
FA_MAX_SPLITS_FOR_CUDA_GRAPH = 32
"""``AttentionConfig.flash_attn_max_num_splits_for_cuda_graph`` (vllm/config/attention.py)."""
MAX_CUDAGRAPH_CAPTURE_SIZE = 512
"""``VllmConfig._set_cudagraph_sizes``: min(max_num_seqs x decode tokens x 2, 512)."""
PIECEWISE_PER_GRAPH_BYTES = 2 * MIB
"""The second PIECEWISE capture: one 2 MiB segment of the graph pool (measured 2, 2 and 0 MiB
on the three probed V1 shapes; vLLM floors it at 1 MiB)."""
FULL_PER_GRAPH_BYTES = 1 * MIB
"""The second FULL capture: vLLM's 1 MiB floor (measured 0 MiB on the three probed shapes)."""
PIECEWISE_POOL_HIDDEN_BUFFERS = 21.7
"""Calibrated: the PIECEWISE first capture's graph pool (over cuBLAS's workspace for the capture
stream) as bf16 hidden-sized buffers at the largest capture size: 152 MiB / (512 x 7,168 x 2 B)
on deepseek-v3-4l-u0.90-graph. Judged on the other probed shapes: 44 / 64 MiB measured against
43 / 87 MiB for Qwen3-30B-A3B / Mixtral-8x7B. The FULL first capture is larger on every probed
shape, so this term has not set a logged estimate yet."""


def v2_model_runner(config: dict[str, Any]) -> bool:
    """True when vLLM 0.25.1 runs the model on its V2 model runner (every dense model and a few
    MoE ones, ``VllmConfig._is_default_v2_model_runner_model``)."""
    architectures = config.get("architectures") or []
    return any(a in V2_RUNNER_MOE_ARCHITECTURES for a in architectures) or not routed_experts(
        config
    )


def moe_layer_flags(config: dict[str, Any]) -> list[bool]:
    """For each decoder layer, whether its MLP is a MoE block (DeepSeek's
    ``first_k_dense_replace``/``moe_layer_freq``, Qwen-MoE's ``decoder_sparse_step``/
    ``mlp_only_layers``; Mixtral and others: every layer)."""
    layers = int(config.get("num_hidden_layers", 0))
    if not routed_experts(config):
        return [False] * layers
    dense_first = int(config.get("first_k_dense_replace") or 0)
    freq = int(config.get("moe_layer_freq") or 1)
    step = int(config.get("decoder_sparse_step") or 1)
    dense = set(config.get("mlp_only_layers") or [])
    return [
        i >= dense_first and i % freq == 0 and (i + 1) % step == 0 and i not in dense
        for i in range(layers)
    ]


def mla_workspace_tokens(max_model_len: int, max_num_seqs: int, block_size: int) -> int:
    """``MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size``."""
    size = min(max(8 * max_model_len, 4 * max_num_seqs * block_size), MLA_WORKSPACE_MAX_TOKENS)
    return max(size, max_num_seqs * block_size)


def moe_workspace_bytes(config: dict[str, Any], tokens: int, tp: int) -> int:
    """The fused-MoE workspace for ``tokens`` (``FusedMoEKernel._allocate_buffers`` with
    ``TritonExperts.workspace_shapes``): ``max(M x topk x max(I, K), M x K)`` shared by the first
    and last GEMM, and ``M x topk x max(2I, K)`` for the activation, bf16, 256-byte aligned.

    ``tp`` is the experts' own split: with ``--enable-expert-parallel`` each rank holds whole
    experts (``FusedMoEParallelConfig.make`` sets the MoE ``tp_size`` to 1) and, without data
    parallel ranks, every token still passes through the local kernel, so I is not divided."""
    inter = int(config.get("moe_intermediate_size") or config.get("intermediate_size", 0)) // tp
    hidden = int(config.get("hidden_size", 0))
    top_k = int(config.get("num_experts_per_tok") or 1)
    common = max(tokens * top_k * max(inter, hidden), tokens * hidden) * 2
    act = tokens * top_k * max(2 * inter, hidden) * 2
    return -(-common // 256) * 256 + act


def _attention_heads(config: dict[str, Any], tp: int) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) on one rank."""
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return heads // tp, max(kv // tp, 1), dim


class ProfileSettings(BaseModel):
    """The serve options the profile run and graph estimate depend on."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    block_size: int
    tensor_parallel_size: int = 1
    expert_parallel: bool = False
    enforce_eager: bool = False
    num_speculative_tokens: int = 0


class ActivationPeak(BaseModel):
    """The profile run's torch peak and the moment that sets it."""

    bytes: int
    moment: str = Field(description="e.g. `attention of layer 4` or `sampler`.")
    parts: dict[str, int] = Field(description="Live buffers at that moment, bytes.")


def activation_peak(
    config: dict[str, Any], settings: ProfileSettings, sm_count: int
) -> ActivationPeak:
    """vLLM's ``torch peak memory increase`` of the profile run (module docstring)."""
    tp = settings.tensor_parallel_size
    tokens = settings.max_num_batched_tokens
    rows = min(tokens, settings.max_num_seqs)
    hidden = int(config.get("hidden_size", 0))
    hid = tokens * hidden * 2
    vocab = int(config.get("vocab_size", 0))
    compiled = not settings.enforce_eager
    moments: list[tuple[str, dict[str, int]]] = []
    persistent = {"cuBLAS workspace": CUBLAS_WORKSPACE_BYTES}
    attention = _mla_attention(config, settings) if "kv_lora_rank" in config else None
    if attention is None:
        q_heads, kv_heads, dim = _attention_heads(config, tp)
        attention = {
            "residual + normed hidden": 2 * hid,
            "q/k/v": tokens * (q_heads + 2 * kv_heads) * dim * 2,
            "attention output": tokens * q_heads * dim * 2,
            "o_proj output": hid,
        }
    dense_i = int(config.get("intermediate_size", 0)) // tp
    for i, moe in enumerate(moe_layer_flags(config)):
        moments.append((f"attention of layer {i}", {**persistent, **attention}))
        if moe:
            experts_tp = 1 if settings.expert_parallel else tp
            persistent["fused-MoE workspace"] = moe_workspace_bytes(config, tokens, experts_tp)
            shared = 2 if _shared_expert_intermediate(config) else 0
            mlp = {"hidden-sized buffers": (4 + shared) * hid}
        else:
            mlp = {
                "hidden-sized buffers": (5 if _gemma_norms(config) else 3) * hid,
                "gate/up + activation": tokens * 3 * dense_i * 2,
            }
        moments.append((f"MLP of layer {i}", {**persistent, **mlp}))
    sampler = {**persistent, "last hidden states": hid, "logits (bf16)": rows * vocab * 2}
    if v2_model_runner(config):
        sampler["logits (fp32 copy)"] = rows * vocab * 4
    else:
        programs = min(sm_count, rows)
        sampler["Triton top-k/top-p buffer"] = min(1 << (programs - 1).bit_length(), sm_count)
        sampler["Triton top-k/top-p buffer"] *= vocab * 4
        sampler["logits, probabilities, noise (fp32)"] = 3 * rows * vocab * 4
    moments.append(("sampler", sampler))
    moment, parts = max(moments, key=lambda m: sum(m[1].values()))
    if compiled and moment.startswith("attention") and "kv_lora_rank" in config:
        moment += " (compiled: only the attention op's inputs and the residual live)"
    return ActivationPeak(bytes=sum(parts.values()), moment=moment, parts=parts)


def _mla_attention(config: dict[str, Any], settings: ProfileSettings) -> dict[str, int]:
    """Live bytes at MLA's profile-run workspace allocation (``MLAAttention.forward_impl``)."""
    tp, tokens = settings.tensor_parallel_size, settings.max_num_batched_tokens
    heads = int(config["num_attention_heads"]) // tp
    nope, rope = int(config["qk_nope_head_dim"]), int(config["qk_rope_head_dim"])
    v_dim, latent = int(config["v_head_dim"]), int(config["kv_lora_rank"])
    q_lora = int(config.get("q_lora_rank") or 0)
    hid = tokens * int(config["hidden_size"]) * 2
    work = mla_workspace_tokens(settings.max_model_len, settings.max_num_seqs, settings.block_size)
    live = {
        "MLA context workspace (profile)": work * heads * (nope + v_dim) * 2,
        "query": tokens * heads * (nope + rope) * 2,
        "attention output": tokens * heads * v_dim * 2,
    }
    if settings.enforce_eager:  # the Python frames still hold the projections' outputs
        live["residual + normed hidden"] = 2 * hid
        live["q/kv down-projection (holds the rope key)"] = tokens * (q_lora + latent + rope) * 2
        live["q and KV latents (normed)"] = tokens * (q_lora + latent) * 2
    else:  # the piecewise graph before the op hands over only the op's inputs and the residual
        live["residual"] = hid
        live["KV latent (normed) + rope key"] = tokens * (latent + rope) * 2
    return live


def _gemma_norms(config: dict[str, Any]) -> bool:
    """Gemma's four norms per layer run out of place (``GemmaRMSNorm``, ``vllm/ir/ops/
    layernorm.py``): two more hidden-sized buffers live at the MLP (measured on Gemma-3-4B)."""
    return str(config.get("model_type", "")).startswith("gemma")


def _shared_expert_intermediate(config: dict[str, Any]) -> int:
    if config.get("shared_expert_intermediate_size"):
        return int(config["shared_expert_intermediate_size"])
    return int(config.get("n_shared_experts") or 0) * int(config.get("moe_intermediate_size") or 0)


class GraphEstimate(BaseModel):
    """vLLM's ``Estimated CUDA graph memory`` and its terms."""

    bytes: int
    piecewise_graphs: int
    full_graphs: int
    piecewise_first_bytes: int
    full_first_bytes: int


def capture_sizes(settings: ProfileSettings) -> list[int]:
    """``VllmConfig._set_cudagraph_sizes``: 1, 2, 4, multiples of 8 below 256, then of 16, up to
    min(max_num_seqs x decode tokens x 2, 512, max_num_batched_tokens)."""
    decode = 1 + settings.num_speculative_tokens
    cap = min(
        settings.max_num_seqs * decode * 2,
        MAX_CUDAGRAPH_CAPTURE_SIZE,
        settings.max_num_batched_tokens,
    )
    sizes = [s for s in (1, 2, 4) if s <= cap]
    sizes += list(range(8, min(cap + 1, 256), 8)) + list(range(256, cap + 1, 16))
    if settings.max_num_batched_tokens <= cap and settings.max_num_batched_tokens not in sizes:
        sizes.append(settings.max_num_batched_tokens)
    return sorted(sizes)


def cudagraph_estimate(config: dict[str, Any], settings: ProfileSettings) -> GraphEstimate:
    """``GPUModelRunner.profile_cudagraph_memory`` for FULL_AND_PIECEWISE on FlashAttention 3
    (module docstring): max(first PIECEWISE, first FULL) + the other graphs' share."""
    sizes = capture_sizes(settings)
    decode = 1 + settings.num_speculative_tokens
    full = [s for s in sizes if s <= settings.max_num_seqs * decode]
    batch = max(full)
    tp = settings.tensor_parallel_size
    splits = FA_MAX_SPLITS_FOR_CUDA_GRAPH
    if "kv_lora_rank" in config:
        heads = int(config["num_attention_heads"]) // tp
        v_dim = int(config["kv_lora_rank"])
        per_token = heads * (
            int(config["qk_nope_head_dim"])
            + int(config["qk_rope_head_dim"])
            + 2 * v_dim
            + int(config["v_head_dim"])
        )
    else:
        heads, kv_heads, v_dim = _attention_heads(config, tp)
        per_token = (2 * heads + 2 * kv_heads) * v_dim
    full_first = splits * batch * heads * (v_dim + 1) * 4 + batch * per_token * 2
    hidden = int(config.get("hidden_size", 0))
    piecewise_first = CUBLAS_WORKSPACE_BYTES + int(
        PIECEWISE_POOL_HIDDEN_BUFFERS * max(sizes) * hidden * 2
    )
    total = (
        max(piecewise_first, full_first)
        + (len(sizes) - 1) * PIECEWISE_PER_GRAPH_BYTES
        + (len(full) - 1) * FULL_PER_GRAPH_BYTES
    )
    return GraphEstimate(
        bytes=total,
        piecewise_graphs=len(sizes),
        full_graphs=len(full),
        piecewise_first_bytes=piecewise_first,
        full_first_bytes=full_first,
    )
