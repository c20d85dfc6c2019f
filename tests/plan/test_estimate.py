"""A model planned from its config.json alone (newcomer review, defect 11): the weights counted
from the architecture match the real checkpoints'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.errors import PlanError
from tandem.plan.config import facts_from_config
from tandem.plan.estimate import estimated_parts

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"


@pytest.mark.parametrize(
    ("name", "checkpoint_bytes"),
    [
        # the safetensors of `tandem model real` (bf16), read by tandem.plan.config
        ("smollm2-135m-instruct.json", 269_030_016),
        ("gemma3-270m.json", 536_196_352),
        # Qwen2.5-7B-Instruct: 7,615,616,512 parameters in bf16 (its model card)
        ("qwen2.5-7b-instruct.json", 2 * 7_615_616_512),
    ],
)
def test_weights_from_the_config_match_the_checkpoint(name, checkpoint_bytes):
    facts = facts_from_config(CONFIGS / name, "org/model", "--config")
    assert abs(facts.total_bytes / checkpoint_bytes - 1) < 0.001
    assert "estimated from config.json" in facts.notes[0]


def test_tied_embeddings_have_no_head_and_untied_ones_do():
    tied = json.loads((CONFIGS / "smollm2-135m-instruct.json").read_text())
    roles = {role for role, _, _ in estimated_parts(tied)}
    assert "lm_head" not in roles and "embedding" in roles
    untied = json.loads((CONFIGS / "qwen2.5-7b-instruct.json").read_text())
    assert "lm_head" in {role for role, _, _ in estimated_parts(untied)}


def test_fp8_halves_the_linear_layers_not_the_embeddings():
    config = json.loads((CONFIGS / "qwen2.5-7b-instruct.json").read_text())
    fp8 = {**config, "quantization_config": {"quant_method": "fp8"}}
    plain, half = dict(_bytes(config)), dict(_bytes(fp8))
    assert half["attention"] * 2 == plain["attention"]
    assert half["embedding"] == plain["embedding"]


def _bytes(config):
    return [(role, size) for role, size, _ in estimated_parts(config)]


def test_a_file_that_is_no_model_config_names_what_it_lacks(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama"}')
    with pytest.raises(PlanError) as caught:
        facts_from_config(bad, "org/model", "--config")
    assert "hidden_size" in caught.value.message and caught.value.field == "--config"
