"""A model's weight bytes from its ``config.json`` alone, for a plan made before any weight is
downloaded (``tandem plan --config``, ``tandem init``, a cache holding only the config).

The checkpoint's own headers are exact (``tandem.plan.config``); without them the bytes are
counted from the architecture, in the parts the planner splits by (``WeightPart``):

- embedding ``vocab x hidden``, and an LM head of the same size unless the embeddings are tied;
- attention per layer: grouped-query ``q``, ``k``, ``v``, ``o`` projections
  (``hidden x heads x head_dim`` for q and o, ``hidden x kv_heads x head_dim`` for k and v),
  or MLA's low-rank ones when ``kv_lora_rank`` is set;
- a gated MLP per layer (``3 x hidden x intermediate``), or, for a mixture of experts, each
  expert's and the shared experts' gated MLP, with ``first_k_dense_replace`` dense layers;
- the norms (``hidden`` per norm, two a layer and a final one), held whole by every TP rank.

Bytes per parameter are the config's dtype (bf16 and fp16: 2, fp32: 4), the quantization's for
the linear layers (fp8: 1, ``bits``/8 for GPTQ and AWQ). Biases, rotary tables and MTP or
drafter layers are left out: the plan notes that its weights are an estimate. Checked against
SmolLM2-135M, Gemma 3 270M and Qwen2.5-7B's real checkpoints in ``tests/plan/test_estimate.py``.
"""

from __future__ import annotations

from typing import Any

_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0, "float": 4.0}
REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size")
"""The sizes every transformer's config.json has, without which nothing is counted."""


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: a multimodal wrapper's ``text_config``, else itself."""
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        return {**text, "architectures": config.get("architectures", [])}
    return config


def estimated_parts(config: dict[str, Any]) -> list[tuple[str, int, int]]:
    """``(role, bytes, replicated bytes)`` of each part (``tandem.plan.config.PartRole``), the
    parts without bytes left out; ``config`` has every key of ``REQUIRED``."""
    dense, linear = _dtype_bytes(config)
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    embedding = int(config["vocab_size"]) * hidden
    dense_mlp, routed, shared = _mlp_params(config)
    norms = hidden * (2 * layers + 1)
    parts = [
        ("embedding", embedding * dense, 0.0),
        ("lm_head", 0.0 if config.get("tie_word_embeddings", False) else embedding * dense, 0.0),
        ("attention", _attention_params(config) * layers * linear, 0.0),
        ("dense_mlp", dense_mlp * linear, 0.0),
        ("routed_experts", routed * linear, 0.0),
        ("shared_experts", shared * linear, 0.0),
        ("other", norms * dense, norms * dense),
    ]
    return [(role, int(size), int(whole)) for role, size, whole in parts if size]


def _dtype_bytes(config: dict[str, Any]) -> tuple[float, float]:
    """Bytes per parameter of the unquantized tensors and of the linear layers."""
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dense = _DTYPE_BYTES.get(dtype.removeprefix("torch."), 2.0)
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if "fp8" in method:
        return dense, 1.0
    if quant.get("bits"):
        return dense, float(quant["bits"]) / 8
    if "fp4" in method:
        return dense, 0.5625  # 4 bits and one 8-bit scale per 16 values
    return dense, dense


def _attention_params(config: dict[str, Any]) -> int:
    hidden = int(config["hidden_size"])
    heads = int(config.get("num_attention_heads", 1))
    if config.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3)
        nope = int(config.get("qk_nope_head_dim", 128))
        rope = int(config.get("qk_rope_head_dim", 64))
        value = int(config.get("v_head_dim", 128))
        kv_lora = int(config["kv_lora_rank"])
        q_lora = config.get("q_lora_rank")
        q = (
            hidden * q_lora + q_lora * heads * (nope + rope)
            if q_lora
            else hidden * heads * (nope + rope)
        )
        return (
            q
            + hidden * (kv_lora + rope)
            + kv_lora * heads * (nope + value)
            + heads * value * hidden
        )
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    return 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim


def routed_experts(config: dict[str, Any]) -> int:
    """Routed experts per MoE layer, by any of the names architectures give them; 0: dense."""
    return int(
        config.get("n_routed_experts")
        or config.get("num_local_experts")
        or config.get("num_experts")
        or 0
    )


def _mlp_params(config: dict[str, Any]) -> tuple[int, int, int]:
    """Parameters of the dense MLPs, the routed experts and the shared experts."""
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    intermediate = int(config.get("intermediate_size") or 4 * hidden)
    experts = routed_experts(config)
    if not experts:
        return 3 * hidden * intermediate * layers, 0, 0
    dense_layers = int(config.get("first_k_dense_replace") or 0)
    moe_layers = layers - dense_layers
    expert = int(config.get("moe_intermediate_size") or intermediate)
    shared_size = int(config.get("shared_expert_intermediate_size") or 0) or expert * int(
        config.get("n_shared_experts") or 0
    )
    return (
        3 * hidden * intermediate * dense_layers,
        3 * hidden * expert * experts * moe_layers,
        3 * hidden * shared_size * moe_layers,
    )
