"""KV bytes per token by architecture and dtype (model-physics.md §1.4), and vLLM's rounding."""

from __future__ import annotations

import pytest

from tandem.errors import PlanError
from tandem.plan.kv import kv_layout

V3 = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}
V32 = {**V3, "model_type": "deepseek_v32", "index_topk": 2048, "index_head_dim": 128}
GQA = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}
HYBRID = {
    **GQA,
    "sliding_window": 1024,
    "layer_types": ["sliding_attention"] * 5 * 4
    + ["full_attention"] * 4
    + ["sliding_attention"] * 8,
}


@pytest.mark.parametrize(
    ("config", "dtype", "tp", "per_token"),
    [
        pytest.param(V3, "fp8", 1, 61 * 576, id="V3 MLA fp8: 576 B a layer, 35.1 KB"),
        pytest.param(V3, "auto", 1, 61 * 1152, id="V3 MLA bf16: 1,152 B a layer, 70.3 KB"),
        pytest.param(V3, "auto", 8, 61 * 1152, id="MLA is replicated: TP does not divide it"),
        pytest.param(
            V32, "fp8_ds_mla", 1, 61 * (656 + 132), id="V3.2 fp8_ds_mla 656 B + indexer 132 B"
        ),
        pytest.param(GQA, "auto", 1, 32 * 2 * 8 * 128 * 2, id="GQA bf16: K and V, 8 heads x 128"),
        pytest.param(GQA, "auto", 4, 32 * 2 * 2 * 128 * 2, id="GQA heads split by TP"),
        pytest.param(
            GQA, "auto", 16, 32 * 2 * 1 * 128 * 2, id="more TP ranks than KV heads: replicated"
        ),
        pytest.param(GQA, "fp8_e4m3", 1, 32 * 2 * 8 * 128, id="GQA fp8: one byte"),
    ],
)
def test_bytes_per_token(config: dict, dtype: str, tp: int, per_token: float) -> None:
    layout = kv_layout(
        config, kv_cache_dtype=dtype, block_size=16, max_model_len=4096, tensor_parallel_size=tp
    )
    assert layout.kv_bytes_per_token_ideal == per_token


def test_a_partial_last_block_costs_a_whole_block() -> None:
    layout = kv_layout(GQA, kv_cache_dtype="auto", block_size=16, max_model_len=1000)
    assert layout.blocks_per_request == 63  # cdiv(1000, 16)
    assert layout.kv_bytes_per_token > layout.kv_bytes_per_token_ideal


def test_hybrid_layers_form_groups_of_equal_size() -> None:
    layout = kv_layout(
        HYBRID, kv_cache_dtype="auto", block_size=16, max_model_len=32768, max_in_flight_tokens=2048
    )
    assert layout.architecture == "hybrid"
    assert len(layout.groups) == 8  # 28 sliding / 4 = 7 groups, 1 full group
    full = [g for g in layout.groups if g.name.startswith("full")]
    assert full[0].blocks_per_request == 2048
    sliding = [g for g in layout.groups if g.name.startswith("sliding")]
    assert sliding[0].blocks_per_request == -(-(1024 - 1 + 2048) // 16) + 1


def test_unknown_kv_dtype_names_the_field() -> None:
    with pytest.raises(PlanError) as exc:
        kv_layout(GQA, kv_cache_dtype="int3", block_size=16, max_model_len=1024)
    assert exc.value.field == "engine.serve.kv_cache_dtype"
