"""KV cache bytes per token, per block and per request, the way vLLM lays the cache out.

vLLM turns the KV pool (bytes per rank) into tokens in three steps, and this module mirrors them
(``vllm/v1/core/kv_cache_utils.py``):

1. ``num_blocks = pool_bytes // bytes_per_block``, where a block holds ``block_size`` tokens of
   every layer of the largest KV cache group.
2. ``max_concurrency = num_blocks / sum over groups of blocks one max-length request needs``
   (full attention: ``cdiv(max_model_len, block_size)``; sliding window: the admission cap
   ``cdiv(min(window - 1 + in-flight tokens, max_model_len), block_size) + 1``).
3. The logged ``KV cache size: N tokens`` is ``int(max_concurrency x max_model_len)``: an
   admission capacity, not a count of physical slots.

Bytes per token and layer by architecture, on one TP rank:

- MHA/GQA: ``2 (K and V) x kv_heads_per_rank x head_dim x dtype bytes``; KV heads are split by
  TP and replicated when TP exceeds them.
- MLA (DeepSeek-V2/V3, Kimi): one latent of ``kv_lora_rank + qk_rope_head_dim`` elements, no
  K/V doubling, replicated on every TP rank. ``fp8_ds_mla`` (V3.2) is a 656-byte record plus a
  132-byte indexer key per token.
- DeepSeek-V4: per layer a compressed MLA cache (one 584-byte record per ``compress_ratio``
  tokens; ratios 4 and 128), an indexer (132 B per compressed entry) on ratio-4 layers, and a
  128-token sliding window on every layer. vLLM packs these into layer tuples; the model of that
  packing (``deepseek_v4_layout``) is derived in model-physics.md §2.2 and labelled as such.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from tandem.errors import PlanError


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVGroup(BaseModel):
    """One KV cache group: layers sharing a block table."""

    name: str
    layers: int
    block_size_tokens: int
    blocks_per_request: int = Field(description="Blocks a max-model-len request takes.")


class KVLayout(BaseModel):
    """How one rank's KV pool turns into tokens and concurrency."""

    architecture: str = Field(
        description="`gqa`, `sliding-window`, `hybrid`, `mla`, "
        "`mla-sparse` (V3.2) or `deepseek-v4`."
    )
    kv_cache_dtype: str
    block_size_tokens: int
    kv_bytes_per_token_ideal: float = Field(
        description="Bytes one token adds to the cache on "
        "one rank, all layers, without padding or reserves."
    )
    bytes_per_block: int = Field(description="Pool bytes one block id costs (vLLM's divisor).")
    blocks_per_request: int = Field(
        description="Block ids one max-model-len request needs, summed over groups."
    )
    max_model_len: int
    groups: list[KVGroup]
    notes: list[str] = Field(default_factory=list)

    @property
    def bytes_per_request(self) -> int:
        return self.bytes_per_block * self.blocks_per_request

    @property
    def kv_bytes_per_token(self) -> float:
        """Pool bytes per *reported* token: what one token of ``KV cache size`` costs."""
        return self.bytes_per_request / self.max_model_len

    def num_blocks(self, pool_bytes: float) -> int:
        return max(int(pool_bytes) // self.bytes_per_block, 0)

    def max_concurrency(self, pool_bytes: float) -> float:
        return self.num_blocks(pool_bytes) / self.blocks_per_request

    def pool_tokens(self, pool_bytes: float) -> int:
        """The ``KV cache size: N tokens`` vLLM would log for this pool."""
        return int(self.max_concurrency(pool_bytes) * self.max_model_len)

    def largest_max_model_len(self, pool_bytes: float, relayout) -> int:
        """The largest max_model_len at which one request still fits (binary search)."""
        low, high = 0, self.max_model_len
        while low < high:
            mid = (low + high + 1) // 2
            if relayout(mid).max_concurrency(pool_bytes) >= 1:
                low = mid
            else:
                high = mid - 1
        return low


_DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp8_inc": 1.0,
    "fp8_ds_mla": 1.0,
    "nvfp4": 0.5625,
    "nvfp4_ds_mla": 0.5625,
}
V4_RECORD_BYTES = 584  # 448 fp8 NoPE + 64 bf16 RoPE + 7 B scales + 1 B pad [R3]
V32_RECORD_BYTES = 656  # 512 fp8 + 16 B scales + 64 x 2 B RoPE [R4]


def model_dtype(config: dict[str, Any]) -> str:
    text = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return text.removeprefix("torch.")


def dtype_bytes(kv_cache_dtype: str | None, config: dict[str, Any]) -> tuple[str, float]:
    """(resolved name, bytes per element) of a ``--kv-cache-dtype``; ``auto`` = model dtype."""
    name = (kv_cache_dtype or "auto").lower()
    if name == "auto":
        name = model_dtype(config)
    if name not in _DTYPE_BYTES:
        raise PlanError(
            f"unknown KV cache dtype '{kv_cache_dtype}'",
            field="engine.serve.kv_cache_dtype",
            hint=f"use auto or one of {', '.join(sorted(_DTYPE_BYTES))}",
        )
    return name, _DTYPE_BYTES[name]


def default_block_size(config: dict[str, Any], device: str) -> tuple[int, str]:
    """vLLM's block size when the recipe sets none, and why (vllm/platforms/cpu.py, cuda)."""
    if is_deepseek_v4(config):
        return 256, "DeepSeek-V4 kernels support only block size 256"
    mla = "kv_lora_rank" in config
    if device == "cpu":
        if mla:
            return 16, "the CPU MLA decode kernel needs block size 16 (128 on AMX CPUs)"
        return 128, "vLLM's CPU default block size"
    if mla:
        return 64, "FlashMLA's block size on CUDA"
    return 16, "vLLM's CUDA default block size"


def is_deepseek_v4(config: dict[str, Any]) -> bool:
    return config.get("model_type") == "deepseek_v4" or "compress_ratios" in config


def layer_kinds(config: dict[str, Any]) -> list[str]:
    """``full`` or ``sliding`` for each decoder layer."""
    layers = int(config["num_hidden_layers"])
    window = config.get("sliding_window")
    if isinstance(config.get("layer_types"), list):
        return [
            "sliding" if "sliding" in str(t) and window else "full"
            for t in config["layer_types"][:layers]
        ]
    if window and config.get("use_sliding_window", True):
        return ["sliding"] * layers
    return ["full"] * layers


def kv_layout(
    config: dict[str, Any],
    *,
    kv_cache_dtype: str | None,
    block_size: int,
    max_model_len: int,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    max_in_flight_tokens: int = 2048,
) -> KVLayout:
    """The KV layout of one rank for this model and these serve options."""
    if is_deepseek_v4(config):
        return deepseek_v4_layout(
            config,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            max_model_len=max_model_len,
            max_in_flight_tokens=max_in_flight_tokens,
        )
    layers = cdiv(int(config["num_hidden_layers"]), pipeline_parallel_size)
    dtype, size = dtype_bytes(kv_cache_dtype, config)
    notes: list[str] = []
    if "kv_lora_rank" in config:
        latent = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim", 64))
        sparse = "index_topk" in config or config.get("model_type") == "deepseek_v32"
        if sparse and dtype == "fp8_ds_mla":
            index_dim = int(config.get("index_head_dim", 128))
            per_layer: float = V32_RECORD_BYTES + index_dim + index_dim // 128 * 4
            arch = "mla-sparse"
        else:
            per_layer = latent * size
            arch = "mla"
        notes.append(
            "MLA: one latent per token and layer, replicated on every TP rank (not split by TP)"
        )
        page: float = per_layer * block_size
        kinds = Counter({"mla": layers})  # one full-attention group of every layer
    else:
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(
            config.get("head_dim")
            or int(config["hidden_size"]) // int(config["num_attention_heads"])
        )
        heads_per_rank = max(heads // tensor_parallel_size, 1)
        if heads < tensor_parallel_size:
            notes.append(
                f"{heads} KV heads over TP={tensor_parallel_size}: each rank holds a "
                "replicated head"
            )
        per_layer = 2 * heads_per_rank * head_dim * size
        page = int(per_layer * block_size)
        kinds = Counter(layer_kinds(config)[:layers])
        arch = "hybrid" if len(kinds) != 1 else "sliding-window" if "sliding" in kinds else "gqa"
    window = int(config.get("sliding_window") or 0)
    full_blocks = cdiv(max_model_len, block_size)
    sliding_blocks = cdiv(min(window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1
    # Hybrid full + sliding: vLLM forms groups of equal layer count so that pages line up.
    hybrid = len(kinds) != 1
    group_layers = min(kinds.values()) if hybrid else layers
    groups = [
        KVGroup(
            name=f"{kind} {i}" if hybrid else kind,
            layers=group_layers,
            block_size_tokens=block_size,
            blocks_per_request=sliding_blocks if kind == "sliding" else full_blocks,
        )
        for kind, count in sorted(kinds.items())
        for i in range(cdiv(count, group_layers) if hybrid else 1)
    ]
    if hybrid:
        notes.append(
            f"hybrid layers {dict(kinds)}: grouped {group_layers} layers a group, as vLLM's "
            "uniform-page-size grouping does (approximation)"
        )
    elif "sliding" in kinds:
        notes.append(
            f"sliding window {window}: a request reserves cdiv(min(window - 1 + "
            f"{max_in_flight_tokens} in-flight tokens, max_model_len), block) + 1 "
            "blocks"
        )
    return KVLayout(
        architecture=arch,
        kv_cache_dtype=dtype,
        block_size_tokens=block_size,
        kv_bytes_per_token_ideal=per_layer * layers,
        bytes_per_block=page * group_layers,
        blocks_per_request=sum(g.blocks_per_request for g in groups),
        max_model_len=max_model_len,
        groups=groups,
        notes=notes,
    )


def deepseek_v4_layout(
    config: dict[str, Any],
    *,
    kv_cache_dtype: str | None,
    block_size: int,
    max_model_len: int,
    max_in_flight_tokens: int,
) -> KVLayout:
    """DeepSeek-V4's packed layer-tuple layout (model-physics.md §2.2; derived, not measured).

    A pool block is one page each of C4A (block/4 records of 584 B), indexer (block/4 keys of
    132 B) and C128A (block/128 records) for every layer tuple; there are as many tuples as the
    larger of the C4A and C128A layer counts. A request takes one block id per ``block_size``
    tokens in each of two full groups (C4 and C128), plus the sliding-window admission reserve
    (64-token blocks, padded to a pool block) in each SWA group of ``tuples`` layers.
    """
    dtype = (kv_cache_dtype or "auto").lower()
    notes = []
    if dtype in ("auto", "fp8", "fp8_e4m3"):
        notes.append(f"kv_cache_dtype {dtype}: vLLM rewrites it to fp8_ds_mla for DeepSeek-V4")
        dtype = "fp8_ds_mla"
    elif dtype not in ("fp8_ds_mla", "nvfp4_ds_mla"):
        raise PlanError(
            f"DeepSeek-V4 supports only fp8 KV layouts, not '{kv_cache_dtype}'",
            field="engine.serve.kv_cache_dtype",
            hint="use fp8_ds_mla or nvfp4_ds_mla",
        )
    if dtype == "nvfp4_ds_mla":
        notes.append("nvfp4_ds_mla (DGX Spark fork) uses the same 584-byte record as fp8_ds_mla")
    layers = int(config["num_hidden_layers"])
    ratios = [int(r) for r in config["compress_ratios"][:layers]]
    n_c4, n_c128 = ratios.count(4), ratios.count(128)
    index_dim = int(config.get("index_head_dim", 128))
    index_bytes = index_dim + index_dim // 128 * 4
    window = int(config.get("sliding_window", 128))
    ideal = n_c4 * (V4_RECORD_BYTES / 4 + index_bytes / 4) + n_c128 * V4_RECORD_BYTES / 128
    tuples = max(n_c4, n_c128)
    tuple_bytes = (block_size // 4) * (V4_RECORD_BYTES + index_bytes) + max(
        block_size // 128, 1
    ) * V4_RECORD_BYTES
    swa_block = block_size // 4
    swa_groups = cdiv(layers, tuples)
    full = cdiv(max_model_len, block_size)
    swa = cdiv(min(window - 1 + max_in_flight_tokens, max_model_len), swa_block) + 1
    groups = [
        KVGroup(name=name, layers=count, block_size_tokens=block_size, blocks_per_request=full)
        for name, count in (("c4a + indexer", n_c4), ("c128a", n_c128))
    ]
    groups += [
        KVGroup(
            name=f"swa {i}",
            layers=min(tuples, layers - i * tuples),
            block_size_tokens=swa_block,
            blocks_per_request=swa,
        )
        for i in range(swa_groups)
    ]
    notes.append(
        f"DeepSeek-V4 packed layout (derived, model-physics.md §2.2): {tuples} layer "
        f"tuples x {tuple_bytes:,} B = {tuples * tuple_bytes:,} B per pool block; a "
        f"request takes 2 x {full} full-group blocks + {swa_groups} SWA groups x {swa} "
        f"admission blocks ({max_in_flight_tokens} in-flight tokens)"
    )
    notes.append(
        f"ideal V4 KV is {ideal:,.0f} B/token; the packing and the SWA reserve make a "
        "reported token cost about twice that. vLLM logs of the Anemll 0.1.1 image "
        "measured 7,786 B per reported token at 1M, 4-8% below this model [R10]"
    )
    return KVLayout(
        architecture="deepseek-v4",
        kv_cache_dtype=dtype,
        block_size_tokens=block_size,
        kv_bytes_per_token_ideal=ideal,
        bytes_per_block=tuples * tuple_bytes,
        blocks_per_request=sum(g.blocks_per_request for g in groups),
        max_model_len=max_model_len,
        groups=groups,
        notes=notes,
    )
