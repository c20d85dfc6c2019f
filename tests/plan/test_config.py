"""Model readers: safetensors headers, tensor classification, where facts come from."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tandem.errors import PlanError
from tandem.plan.config import (
    classify_tensor,
    load_model_facts,
    read_safetensors_header,
    shipped_facts,
)

CONFIG = {
    "model_type": "mixtral",
    "num_hidden_layers": 2,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "torch_dtype": "bfloat16",
}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A real safetensors file: 8-byte header length, JSON header, then the bytes."""
    header, offset = {}, 0
    for name, (dtype, shape, size) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [16, 8], 256),
            "model.layers.0.self_attn.q_proj.weight": ("BF16", [8, 8], 128),
            "model.layers.0.input_layernorm.weight": ("BF16", [8], 16),
            "model.layers.0.block_sparse_moe.gate.weight": ("BF16", [4, 8], 64),
            "model.layers.0.block_sparse_moe.experts.0.w1.weight": ("F8_E4M3", [8, 8], 64),
        },
    )
    write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors",
        {
            "model.layers.2.eh_proj.weight": ("BF16", [8, 16], 256),
            "lm_head.weight": ("BF16", [16, 8], 256),
        },
    )
    return tmp_path


def test_header_gives_exact_bytes_without_loading(snapshot: Path) -> None:
    header = read_safetensors_header(snapshot / "model-00002-of-00002.safetensors")
    assert header["lm_head.weight"]["data_offsets"] == [256, 512]


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("model.embed_tokens.weight", "embedding"),
        ("lm_head.weight", "lm_head"),
        ("model.layers.3.mlp.experts.17.down_proj.weight", "routed_experts"),
        ("model.layers.3.mlp.shared_experts.up_proj.weight", "shared_experts"),
        ("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", "attention"),
        ("model.layers.0.mlp.down_proj.weight", "dense_mlp"),
        ("model.layers.61.eh_proj.weight", "drafter"),
        ("model.norm.weight", "other"),
    ],
)
def test_tensors_are_sorted_into_parts_by_name(name: str, role: str) -> None:
    assert classify_tensor(name, num_hidden_layers=61) == role


def test_model_dir_wins_and_replicated_bytes_are_counted(snapshot: Path) -> None:
    facts = load_model_facts("org/whatever", model_dir=snapshot)
    parts = {p.role: p for p in facts.parts}
    assert facts.total_bytes == 256 + 128 + 16 + 64 + 64 + 256 + 256
    assert parts["routed_experts"].bytes == 64
    assert parts["drafter"].bytes == 256
    assert parts["other"].replicated_bytes == 16 + 64  # norm and router
    assert facts.source.startswith("model-dir")


def test_a_local_snapshot_wins_over_shipped_data(snapshot: Path, tmp_path_factory) -> None:
    home = tmp_path_factory.mktemp("hf")
    repo = home / "hub" / "models--deepseek-ai--DeepSeek-V4-Flash"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc")
    (repo / "snapshots").mkdir()
    (repo / "snapshots" / "abc").symlink_to(snapshot)
    facts = load_model_facts("deepseek-ai/DeepSeek-V4-Flash", cache_roots=[home])
    assert facts.source.startswith("hf-cache")
    shipped = load_model_facts("deepseek-ai/DeepSeek-V4-Flash", cache_roots=[])
    assert shipped.source.startswith("shipped")
    assert shipped.config["compress_ratios"].count(4) == 21


def test_both_seed_models_ship() -> None:
    for repo_id in ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Flash-DSpark"):
        assert shipped_facts(repo_id) is not None
    dspark = load_model_facts("deepseek-ai/DeepSeek-V4-Flash-DSpark", cache_roots=[])
    assert dspark.total_bytes == 166_886_535_336
    assert sum(p.bytes for p in dspark.parts) == dspark.total_bytes
    assert all(p.source for p in dspark.parts)


def test_an_unknown_model_names_the_flags_that_fix_it() -> None:
    with pytest.raises(PlanError) as exc:
        load_model_facts("org/nothing-here", cache_roots=[])
    assert "--model-dir" in exc.value.hint and "--config" in exc.value.hint


@pytest.mark.parametrize(
    ("repo_id", "command"),
    [
        ("tandem-org/tiny-deepseek-v3", "`tandem model tiny`"),
        ("tandem-org/smollm2-135m-instruct", "`tandem model real`"),
        ("tandem-shapes/llama-3.1-8b", "`tandem model shape llama-3.1-8b`"),
    ],
)
def test_a_model_tandem_builds_is_missing_with_the_command_that_builds_it(repo_id, command):
    """Newcomer review, defect 1: no hub has these ids, so never a download."""
    with pytest.raises(PlanError) as exc:
        load_model_facts(repo_id, cache_roots=[])
    assert command in exc.value.hint and "--model-dir" not in exc.value.hint


def test_a_file_that_is_not_safetensors_is_a_plan_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"\x01")
    with pytest.raises(PlanError):
        read_safetensors_header(bad)
