"""Random-weight models of real shape (Llama-3.1-8B, DeepSeek-V2-Lite/V3, Gemma-3-4B, Qwen3-MoE,
Mixtral) for GPU runs.

The tiny models of ``tandem.models.tiny`` measure vLLM's per-step overhead, not a GPU: their
weights are megabytes and their KV cache is a rounding error. What the planner predicts on a GPU
(weights memory, the KV pool, concurrency, the decode roofline) only means something for a model
of the real shape, and the machines that have GPUs cannot download one. So a preset here copies
the shape of a published checkpoint (every field that sets memory and compute: hidden size,
layers, heads, KV heads, MLA ranks, experts, sliding window, vocabulary) and fills it with random
bf16 weights, built where it runs, on the GPU when there is one.

Algorithm of ``build_shape_model``:

0. Check every argument (``check_arguments``) before torch and transformers are imported: they
   take seconds to load, and a typo is answered at once. This module imports them only inside
   the functions that build.
1. Make the preset's config (``SHAPES``); ``layers`` cuts the layer count (a smaller disk) and
   ``scale_down`` shrinks every width for a test on a CPU. The vocabulary stays the preset's: the
   local tokenizer of ``tandem.models.tiny`` (2,050 ids) uses its first ids only, as a real model's
   tokenizer may leave ids of a padded vocabulary unused.
2. Seed torch, build the model in bf16 directly on ``device`` (``torch.device`` as the default
   device, so 8 B parameters are initialised by the GPU in a second), save it as safetensors
   shards, config and generation_config beside the tokenizer.
3. Store it in the Hugging Face cache exactly as ``models.tiny`` does (blobs by sha256, snapshot
   of relative links, ``refs/main``); the files are hashed in parallel, since they are gigabytes.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from tandem import hf_cache
from tandem.built_models import shape_repo_id
from tandem.errors import ProblemList, SpecError
from tandem.models.store import store_built

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["SHAPES", "ShapeModel", "build_shape_model", "check_arguments", "shape_repo_id"]

MAX_POSITION_EMBEDDINGS = 131072
# scale_down: widths a CPU builds in seconds, with the preset's kinds of layer kept.
_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def _llama_3_1_8b(layers: int | None, small: bool, **common) -> PretrainedConfig:
    """meta-llama/Llama-3.1-8B: GQA 32 heads / 8 KV heads, 128,256-token vocabulary."""
    from transformers import LlamaConfig

    widths = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32)
    if small:
        widths = dict(_SMALL)
    return LlamaConfig(
        **widths,
        num_hidden_layers=layers or 32,
        num_key_value_heads=8 if not small else 2,
        head_dim=128 if not small else 16,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        **common,
    )


def _deepseek_v2_lite(layers: int | None, small: bool, **common) -> PretrainedConfig:
    """deepseek-ai/DeepSeek-V2-Lite: MLA (latent 512 + rope 64, no q LoRA), 64 routed experts
    + 2 shared, 6 per token, first layer dense, 102,400-token vocabulary. RoPE's YaRN scaling
    is left out (it changes no memory and no FLOP count)."""
    from transformers import DeepseekV2Config

    widths = dict(
        hidden_size=2048,
        intermediate_size=10944,
        num_attention_heads=16,
        moe_intermediate_size=1408,
        n_routed_experts=64,
    )
    if small:
        widths = dict(_SMALL, moe_intermediate_size=32, n_routed_experts=8)
    return DeepseekV2Config(
        **widths,
        num_hidden_layers=layers or 27,
        num_key_value_heads=widths["num_attention_heads"],
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        n_shared_experts=2,
        num_experts_per_tok=6,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
        norm_topk_prob=False,
        scoring_func="softmax",
        vocab_size=102400,
        rms_norm_eps=1e-6,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=False,
        **common,
    )


def _gemma_3_4b(layers: int | None, small: bool, **common) -> PretrainedConfig:
    """The text decoder of google/gemma-3-4b-it as ``Gemma3ForCausalLM``: hybrid attention, five
    1,024-token sliding-window layers to one global layer, 8 heads / 4 KV heads of 256,
    262,208-token vocabulary, tied embeddings."""
    from transformers import Gemma3TextConfig

    widths = dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=8)
    if small:
        widths = dict(_SMALL)
    return Gemma3TextConfig(
        **widths,
        num_hidden_layers=layers or 34,
        num_key_value_heads=4 if not small else 2,
        head_dim=256 if not small else 16,
        query_pre_attn_scalar=256,
        sliding_window=1024,
        vocab_size=262208,
        rms_norm_eps=1e-6,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=True,
        **common,
    )


def _deepseek_v3(layers: int | None, small: bool, **common) -> PretrainedConfig:
    """deepseek-ai/DeepSeek-V3 in bf16: MLA with 128 heads (q LoRA 1,536, latent 512 + rope 64),
    256 routed experts + 1 shared, 8 per token in 8 groups (top 4 groups), sigmoid scores, the
    first three layers dense (cut it to 4 layers or more to keep a MoE layer), 129,280-token
    vocabulary. The published checkpoint is fp8; the MTP layer and RoPE's YaRN scaling are left
    out (neither is loaded by a plain serve)."""
    from transformers import DeepseekV3Config

    widths = dict(
        hidden_size=7168,
        intermediate_size=18432,
        num_attention_heads=128,
        moe_intermediate_size=2048,
        n_routed_experts=256,
        q_lora_rank=1536,
    )
    routing = dict(num_experts_per_tok=8, n_group=8, topk_group=4)
    if small:
        widths = dict(_SMALL, moe_intermediate_size=32, n_routed_experts=8, q_lora_rank=32)
        routing = dict(num_experts_per_tok=2, n_group=2, topk_group=1)
    return DeepseekV3Config(
        **widths,
        **routing,
        num_hidden_layers=layers or 61,
        num_key_value_heads=widths["num_attention_heads"],
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        n_shared_experts=1,
        first_k_dense_replace=3,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        num_nextn_predict_layers=0,
        vocab_size=129280,
        rms_norm_eps=1e-6,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=False,
        **common,
    )


def _qwen3_30b_a3b(layers: int | None, small: bool, **common) -> PretrainedConfig:
    """Qwen/Qwen3-30B-A3B: GQA 32 heads / 4 KV heads of 128, every layer MoE (128 experts, 8 per
    token, no shared expert), 151,936-token vocabulary. ``num_experts`` is written under both
    names transformers has used for it."""
    from transformers import Qwen3MoeConfig

    widths = dict(
        hidden_size=2048, intermediate_size=6144, num_attention_heads=32, moe_intermediate_size=768
    )
    experts = 128
    if small:
        widths = dict(_SMALL, moe_intermediate_size=32)
        experts = 8
    config = Qwen3MoeConfig(
        **widths,
        num_hidden_layers=layers or 48,
        num_key_value_heads=4 if not small else 2,
        head_dim=128 if not small else 16,
        num_local_experts=experts,
        num_experts_per_tok=8 if not small else 2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=False,
        **common,
    )
    config.num_experts = experts
    return config


def _mixtral_8x7b(layers: int | None, small: bool, **common) -> PretrainedConfig:
    """mistralai/Mixtral-8x7B-v0.1: GQA 32 heads / 8 KV heads, every layer MoE with 8 large
    experts (14,336 wide), 2 per token, 32,000-token vocabulary."""
    from transformers import MixtralConfig

    widths = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32)
    if small:
        widths = dict(_SMALL)
    return MixtralConfig(
        **widths,
        num_hidden_layers=layers or 32,
        num_key_value_heads=8 if not small else 2,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
        rms_norm_eps=1e-5,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=False,
        **common,
    )


SHAPES: dict[str, tuple[Callable[..., PretrainedConfig], str]] = {
    "llama-3.1-8b": (_llama_3_1_8b, "LlamaForCausalLM"),
    "deepseek-v2-lite": (_deepseek_v2_lite, "DeepseekV2ForCausalLM"),
    "gemma-3-4b": (_gemma_3_4b, "Gemma3ForCausalLM"),
    "deepseek-v3": (_deepseek_v3, "DeepseekV3ForCausalLM"),
    "qwen3-30b-a3b": (_qwen3_30b_a3b, "Qwen3MoeForCausalLM"),
    "mixtral-8x7b": (_mixtral_8x7b, "MixtralForCausalLM"),
}
"""Preset name -> (config factory, architecture vLLM loads)."""
MIN_LAYERS = 2
"""DeepSeek's first layer is dense and the rest MoE: fewer would build no MoE layer."""
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_arguments(preset: str, *, layers: int | None = None, device: str | None = None) -> None:
    """Refuse what ``build_shape_model`` cannot build, every problem at once, without
    importing torch.

    Raises:
        SpecError: an unknown preset, fewer than ``MIN_LAYERS`` layers, or a device that is
            neither ``cpu`` nor ``cuda`` (``cuda:N``).
    """
    problems = ProblemList()
    if preset not in SHAPES:
        problems.add(
            "preset", f"unknown shape preset {preset!r}", f"use one of: {', '.join(SHAPES)}"
        )
    if layers is not None and layers < MIN_LAYERS:
        problems.add(
            "layers",
            f"layers {layers} is too few",
            f"use {MIN_LAYERS} or more (DeepSeek's first layer is dense, the rest MoE)",
        )
    if device is not None and not _DEVICE.fullmatch(device):
        problems.add(
            "device",
            f"{device!r} is not a device torch builds on here",
            "write cpu, cuda or cuda:N (e.g. cuda:0), or leave it out for cuda when there is one",
        )
    if len(problems.items) == 1:
        p = problems.items[0]
        raise SpecError(p.message, field=p.field, hint=p.hint)
    if problems:
        raise SpecError(f"{len(problems.items)} invalid argument(s)", problems=problems.items)


class ShapeModel(BaseModel):
    """What ``build_shape_model`` built and where it lies in the cache."""

    model_config = ConfigDict(frozen=True)

    repo_id: str = Field(
        description="Hub repo id vLLM is given, e.g. `tandem-shapes/llama-3.1-8b`."
    )
    preset: str = Field(description="Key in SHAPES.")
    commit: str = Field(description="40-hex snapshot id, a digest of the files' contents.")
    snapshot_path: Path = Field(description="`.../hub/models--ORG--NAME/snapshots/<commit>`.")
    parameter_count: int = Field(description="Number of model parameters.")
    size_bytes: int = Field(description="Total size of the snapshot's files in bytes.")
    num_hidden_layers: int = Field(description="Layers built (the preset's unless cut).")


def build_shape_model(
    hf_home: Path,
    preset: str,
    *,
    layers: int | None = None,
    scale_down: bool = False,
    device: str | None = None,
    seed: int = 0,
    repo_id: str | None = None,
) -> ShapeModel:
    """Build a random-weight model of a real checkpoint's shape into the HF cache under hf_home.

    Usage:
        built = build_shape_model(Path("/root/hf"), "llama-3.1-8b", device="cuda")
        # HF_HOME=/root/hf HF_HUB_OFFLINE=1 vllm serve tandem-shapes/llama-3.1-8b

    Args:
        hf_home: the folder ``HF_HOME`` points at; files go under ``hf_home/hub``.
        preset: a key of ``SHAPES``.
        layers: build this many decoder layers instead of the preset's (to save disk).
        scale_down: tiny widths, same kinds of layer (tests on a CPU).
        device: where torch builds the weights; default ``cuda`` when available, else ``cpu``.
        seed: seeds the weights and the tokenizer corpus.
        repo_id: hub id to store it as; default ``shape_repo_id(preset, ...)``.

    Returns:
        The ``ShapeModel``.

    Raises:
        SpecError: an argument ``check_arguments`` refuses, or ``cuda`` asked for where torch
            finds no GPU.
    """
    check_arguments(preset, layers=layers, device=device)
    import torch

    from tandem.models.tiny import _train_tokenizer, save_model, special_token_ids

    if device and device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise SpecError(
                f"device {device} asked for, but torch finds "
                f"{torch.cuda.device_count()} CUDA GPU(s) here",
                field="device",
                hint="build with --device cpu (with --scale-down for a quick one), a GPU "
                "index that exists, or on a machine with a GPU",
            )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    repo_id = repo_id or shape_repo_id(preset, layers=layers, scale_down=scale_down)
    repo_dir = hf_cache.repo_dir(Path(hf_home), repo_id)
    repo_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=repo_dir, prefix=".build-") as tmp:
        staging = Path(tmp)
        tokenizer = _train_tokenizer(seed)
        tokenizer.save_pretrained(staging)
        factory, architecture = SHAPES[preset]
        config = factory(layers, scale_down, **special_token_ids(tokenizer))
        config.architectures = [architecture]
        parameter_count = save_model(config, tokenizer, seed, staging, device)
        snapshot, commit, size_bytes = store_built(repo_dir, staging)
    return ShapeModel(
        repo_id=repo_id,
        preset=preset,
        commit=commit,
        snapshot_path=snapshot,
        parameter_count=parameter_count,
        size_bytes=size_bytes,
        num_hidden_layers=config.num_hidden_layers,
    )
