"""The shape presets: scaled-down builds on a CPU keep each preset's kind of model and its
vocabulary, and land in the Hugging Face cache layout vLLM reads offline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from tandem.cli.model import model_command
from tandem.errors import SpecError
from tandem.models.shapes import SHAPES, build_shape_model, check_arguments, shape_repo_id


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf")
    layers = {"deepseek-v2-lite": 3, "gemma-3-4b": 6, "deepseek-v3": 4}
    return home, {
        p: build_shape_model(home, p, layers=layers.get(p, 2), scale_down=True, device="cpu")
        for p in SHAPES
    }


def _config(model) -> dict:
    return json.loads((model.snapshot_path / "config.json").read_text())


def test_llama_preset_keeps_gqa_and_the_128k_vocabulary(built):
    config = _config(built[1]["llama-3.1-8b"])
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 128256
    assert config["num_attention_heads"] // config["num_key_value_heads"] == 2
    assert config["rope_parameters"]["rope_type"] == "llama3"
    assert config["num_hidden_layers"] == 2


def test_deepseek_preset_keeps_mla_and_moe(built):
    config = _config(built[1]["deepseek-v2-lite"])
    assert config["architectures"] == ["DeepseekV2ForCausalLM"]
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"], config["q_lora_rank"]) == (
        512,
        64,
        None,
    )
    assert (config["n_shared_experts"], config["num_experts_per_tok"]) == (2, 6)
    assert config["first_k_dense_replace"] == 1 and config["vocab_size"] == 102400
    names = safe_open(
        str(built[1]["deepseek-v2-lite"].snapshot_path / "model.safetensors"), "pt"
    ).keys()
    assert any(".mlp.experts." in n for n in names) and any(
        "kv_a_proj_with_mqa" in n for n in names
    )


def test_deepseek_v3_preset_keeps_mla_with_q_lora_and_grouped_sigmoid_routing(built):
    config = _config(built[1]["deepseek-v3"])
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (config["kv_lora_rank"], config["q_lora_rank"] > 0) == (512, True)
    assert (config["first_k_dense_replace"], config["n_shared_experts"]) == (3, 1)
    assert (config["scoring_func"], config["topk_method"]) == ("sigmoid", "noaux_tc")
    assert config["vocab_size"] == 129280 and config["num_hidden_layers"] == 4


def test_moe_presets_without_mla(built):
    qwen = _config(built[1]["qwen3-30b-a3b"])
    mixtral = _config(built[1]["mixtral-8x7b"])
    assert qwen["architectures"] == ["Qwen3MoeForCausalLM"] and "kv_lora_rank" not in qwen
    assert (qwen["vocab_size"], qwen["mlp_only_layers"]) == (151936, [])
    assert mixtral["architectures"] == ["MixtralForCausalLM"]
    assert (mixtral["num_local_experts"], mixtral["num_experts_per_tok"]) == (8, 2)


def test_gemma_preset_is_hybrid_sliding_window(built):
    config = _config(built[1]["gemma-3-4b"])
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["sliding_window"] == 1024 and config["vocab_size"] == 262208
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]


def test_presets_land_in_the_hf_cache_layout(built):
    home, models = built
    for preset, model in models.items():
        assert model.repo_id == shape_repo_id(
            preset, layers=model.num_hidden_layers, scale_down=True
        )
        repo = home / "hub" / f"models--{model.repo_id.replace('/', '--')}"
        assert (repo / "refs" / "main").read_text() == model.commit
        assert model.snapshot_path == repo / "snapshots" / model.commit
        for name in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "generation_config.json",
        ):
            link = model.snapshot_path / name
            assert link.is_symlink() and link.resolve().parent == repo / "blobs"


def test_tokenizer_is_smaller_than_the_model_vocabulary(built):
    snapshot = built[1]["llama-3.1-8b"].snapshot_path
    vocab = json.loads((snapshot / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) < _config(built[1]["llama-3.1-8b"])["vocab_size"]


def test_unknown_preset_and_too_few_layers_are_refused(tmp_path):
    with pytest.raises(SpecError, match="unknown shape preset"):
        build_shape_model(tmp_path, "llama-70b")
    with pytest.raises(SpecError, match="too few"):
        build_shape_model(tmp_path, "llama-3.1-8b", layers=1)


def test_cli_builds_a_scaled_down_preset(tmp_path):
    result = CliRunner().invoke(
        model_command,
        [
            "shape",
            "gemma-3-4b",
            "--scale-down",
            "--layers",
            "2",
            "--device",
            "cpu",
            "--hf-home",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "tandem-shapes/gemma-3-4b-2l-small" in result.output
    assert (
        tmp_path / "hub" / "models--tandem-shapes--gemma-3-4b-2l-small" / "refs" / "main"
    ).is_file()


def test_bad_arguments_are_refused_at_once_before_torch_is_imported(tmp_path):
    """torch and transformers take seconds to import: a typo is answered without them, every
    fault in one message, and nothing is written."""
    code = (
        "import sys; from tandem.cli import main; "
        "rc = main(['model', 'shape', 'llama-3.1-8b', '--layers', '1', '--device', 'gpu', "
        f"'--hf-home', {str(tmp_path / 'hf')!r}]); "
        "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split()[-3:] == ["2", "False", "False"], done.stdout + done.stderr
    assert "layers 1 is too few" in done.stderr and "'gpu'" in done.stderr, done.stderr
    assert not (tmp_path / "hf").exists()


def test_check_arguments_names_every_fault():
    with pytest.raises(SpecError) as info:
        check_arguments("llama-70b", layers=0, device="cuda0")
    assert {p.field for p in info.value.problems} == {"preset", "layers", "device"}
    check_arguments("gemma-3-4b", layers=2, device="cuda:1")  # no error
