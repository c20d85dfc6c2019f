"""The tiny model builder: determinism, the hub cache layout, the tokenizer and every architecture.

Builds run in tmp folders; the deepseek_v3 build is shared by the module-scoped fixture because
each build takes a few seconds. Serving with the real vLLM is tested elsewhere (engine marker).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from huggingface_hub import snapshot_download
from transformers import AutoConfig, AutoTokenizer

from tandem import built_models
from tandem.cli.model import model_command
from tandem.errors import SpecError
from tandem.models.tiny import (
    ARCHITECTURES,
    DEFAULT_ARCH,
    TinyModel,
    _train_tokenizer,
    build_tiny_model,
)

REPO_DIR = Path("hub") / "models--tandem-org--tiny-deepseek-v3"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is a rank?"},
]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="module")
def tiny(hf_home: Path) -> TinyModel:
    return build_tiny_model(hf_home)


@pytest.fixture(scope="module")
def offline(hf_home: Path, tiny: TinyModel) -> Path:
    """The snapshot as vLLM finds it offline: repo id -> refs/main -> snapshots/<commit>.

    huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once, at import, so setting them here
    would not take; ``local_files_only`` is the same lookup without the network.
    """
    return Path(snapshot_download(tiny.repo_id, cache_dir=hf_home / "hub", local_files_only=True))


def test_same_inputs_give_the_same_commit_in_another_folder(
    tiny: TinyModel, tmp_path: Path
) -> None:
    _train_tokenizer.cache_clear()  # the tokenizer trained again, as in another process
    again = build_tiny_model(tmp_path)
    assert again.commit == tiny.commit
    assert again.size_bytes == tiny.size_bytes
    assert again.parameter_count == tiny.parameter_count


def test_another_seed_gives_another_commit(tiny: TinyModel, tmp_path: Path) -> None:
    assert build_tiny_model(tmp_path, seed=1).commit != tiny.commit


def test_rebuilding_over_an_identical_snapshot_changes_nothing(
    tiny: TinyModel, hf_home: Path
) -> None:
    repo = hf_home / REPO_DIR
    before = {p: p.stat().st_mtime_ns for p in repo.rglob("*")}
    assert build_tiny_model(hf_home) == tiny
    after = {p: p.stat().st_mtime_ns for p in repo.rglob("*")}
    assert after == before


def test_cache_layout_is_refs_snapshot_symlinks_and_blobs(tiny: TinyModel, hf_home: Path) -> None:
    repo = hf_home / REPO_DIR
    assert tiny.repo_id == "tandem-org/tiny-deepseek-v3"
    assert re.fullmatch(r"[0-9a-f]{40}", tiny.commit)
    assert (repo / "refs" / "main").read_text() == tiny.commit
    assert tiny.snapshot_path == repo / "snapshots" / tiny.commit
    names = {p.name for p in tiny.snapshot_path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    for link in tiny.snapshot_path.iterdir():
        assert link.is_symlink()
        target = Path(os.readlink(link))
        assert not target.is_absolute()
        assert link.resolve().parent == (repo / "blobs").resolve()
        assert re.fullmatch(r"[0-9a-f]{64}", link.resolve().name)
    assert sorted(p.name for p in repo.iterdir()) == ["blobs", "refs", "snapshots"]


def test_config_keeps_what_the_cpu_mla_kernel_needs(tiny: TinyModel) -> None:
    config = json.loads((tiny.snapshot_path / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3"
    assert config["kv_lora_rank"] + config["qk_rope_head_dim"] == 576
    assert config["first_k_dense_replace"] == 1
    assert config["num_hidden_layers"] == 3
    assert (config["n_routed_experts"], config["num_experts_per_tok"]) == (8, 2)
    assert config["topk_method"] == "noaux_tc"
    assert config["scoring_func"] == "sigmoid"
    assert config["num_nextn_predict_layers"] == 0
    assert config["dtype"] == "bfloat16"


def test_tokenizer_loads_offline_and_fits_the_vocabulary(tiny: TinyModel, offline: Path) -> None:
    assert offline == tiny.snapshot_path
    tokenizer = AutoTokenizer.from_pretrained(offline)
    config = json.loads((tiny.snapshot_path / "config.json").read_text())
    generation = json.loads((tiny.snapshot_path / "generation_config.json").read_text())
    end_id = tokenizer.convert_tokens_to_ids("<|end|>")
    assert 2000 <= len(tokenizer) <= 2100
    assert config["vocab_size"] >= len(tokenizer)
    assert config["vocab_size"] % 64 == 0
    assert tokenizer.eos_token_id == config["eos_token_id"] == generation["eos_token_id"] == end_id
    assert tokenizer.bos_token == "<|begin|>"
    assert tokenizer.pad_token == "<|pad|>"
    assert set(generation) == {"bos_token_id", "eos_token_id", "pad_token_id"}
    for token in ("<think>", "</think>"):
        assert len(tokenizer(token, add_special_tokens=False).input_ids) == 1


@pytest.mark.parametrize(
    ("kwargs", "ending"),
    [({"thinking": True}, "<|Assistant|><think>"), ({}, "<|Assistant|></think>")],
    ids=["thinking on ends with <think>", "thinking off ends with </think>"],
)
def test_chat_template_ends_the_generation_prompt_like_deepseek(
    tiny: TinyModel, offline: Path, kwargs: dict[str, bool], ending: str
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(offline)
    text = tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert text == "<|begin|>Be brief.<|User|>What is a rank?" + ending


def test_assistant_turns_are_closed_by_end(tiny: TinyModel, offline: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(offline)
    text = tokenizer.apply_chat_template(
        [*MESSAGES, {"role": "assistant", "content": "A process."}], tokenize=False
    )
    assert text.endswith("<|Assistant|></think>A process.<|end|>")


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "deepseek_v3"])
def test_every_architecture_builds(arch: str, tmp_path: Path) -> None:
    tiny = build_tiny_model(tmp_path, arch=arch)
    assert tiny.repo_id == f"tandem-org/tiny-{arch.replace('_', '-')}"
    config = AutoConfig.from_pretrained(tiny.snapshot_path)
    assert config.model_type == arch
    assert config.max_position_embeddings >= 2048
    assert 0 < tiny.parameter_count < 20_000_000


def test_an_unknown_architecture_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        build_tiny_model(tmp_path, arch="gpt5")
    assert info.value.field == "arch"
    assert "deepseek_v3" in info.value.hint


def test_cli_builds_and_prints_the_repo_id(tiny: TinyModel, hf_home: Path) -> None:
    result = CliRunner().invoke(model_command, ["tiny", "--hf-home", str(hf_home)])
    assert result.exit_code == 0, result.output
    assert "tandem-org/tiny-deepseek-v3" in result.output
    assert tiny.commit[:8] in result.output


def test_the_cli_offers_exactly_the_models_the_builders_make():
    """`tandem model` names them without importing torch; this keeps the names in step."""
    assert tuple(ARCHITECTURES) == built_models.TINY_ARCHITECTURES
    assert built_models.DEFAULT_TINY_ARCH == DEFAULT_ARCH


def test_model_help_does_not_import_torch():
    code = (
        "import sys; from click.testing import CliRunner; from tandem.cli.model import "
        "model_command; r = CliRunner().invoke(model_command, ['shape', '--help']); "
        "assert r.exit_code == 0, r.output; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
