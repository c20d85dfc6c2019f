"""DeepSeek-V4-Flash-DSpark on 2x GB10 with the seed recipe, against model-physics.md's ranges.

The model's config.json and weight sizes ship with tandem, so these tests need no download.
Ranges (model-physics.md): weights per rank 77.7-80.4 GiB (§2.4 step 3), ~7.8 KB per reported
token at 1M (§2.3, measured 7,762-7,786 B), 8.45-9.2 KB at 512K (§2.4 step 4), KV pool at util
0.85 about 19.9-21 GiB (§2.4 step 4, plus the smaller 512K prefill workspace), 2.3-2.7M tokens
at 512K, per node 115-117 GB (seed 000, §2.4 step 7).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tandem.cli.plan import plan_command
from tandem.plan.config import load_model_facts
from tandem.plan.hardware import load_profile
from tandem.plan.kv import kv_layout
from tandem.plan.planner import Plan, infer_hardware, plan_deployment
from tandem.spec.loading import load_deployment

GIB = 1024**3
SEED = ("deepseek-v4-flash-dspark", "examples/dgx-spark-eks.yaml")


@pytest.fixture(scope="module")
def seed_plan() -> Plan:
    deployment = load_deployment(*SEED)
    facts = load_model_facts(deployment.recipe.model.repo_id, cache_roots=[])
    return plan_deployment(deployment, facts, infer_hardware(deployment, None))


def plan_at(**overrides) -> Plan:
    deployment = load_deployment(*SEED)
    facts = load_model_facts(deployment.recipe.model.repo_id, cache_roots=[])
    return plan_deployment(deployment, facts, load_profile("gb10"), **overrides)


def test_the_seed_cluster_is_planned_as_gb10(seed_plan: Plan) -> None:
    assert seed_plan.hardware == "gb10"
    assert seed_plan.model_source.startswith("shipped")


def test_weights_per_rank_are_half_the_checkpoint_plus_what_is_replicated(seed_plan: Plan) -> None:
    # 166,886,535,336 B checkpoint; 0.76 GB replicated on both ranks.
    assert seed_plan.weights_bytes_per_rank == pytest.approx(
        (166_886_535_336 - 0.76e9) / 2 + 0.76e9, rel=1e-6
    )
    assert 77.7 <= seed_plan.weights_gib_per_rank <= 80.4


def test_ideal_kv_is_3850_bytes_per_token(seed_plan: Plan) -> None:
    assert seed_plan.kv_bytes_per_token_ideal == pytest.approx(3850, abs=1)


def test_a_reported_token_costs_about_7_8_kb_at_1m() -> None:
    plan = plan_at(max_model_len=1_048_576, gpu_memory_utilization=0.835)
    assert 7_700 <= plan.kv_bytes_per_token <= 7_900
    # Before calibration the packed-layout model (§2.2) gives 8.1-8.45 KB.
    assert 8_100 <= plan.kv_bytes_per_token_layout_model <= 8_450


def test_the_layout_model_alone_is_within_the_derived_range_at_1m() -> None:
    config = load_model_facts("deepseek-ai/DeepSeek-V4-Flash-DSpark", cache_roots=[]).config
    for in_flight in (8192, 16384):
        layout = kv_layout(
            config,
            kv_cache_dtype="nvfp4_ds_mla",
            block_size=256,
            max_model_len=1_048_576,
            max_in_flight_tokens=in_flight,
        )
        assert 7_700 <= layout.kv_bytes_per_token <= 8_450
        assert layout.bytes_per_block == 21 * (64 * 584 + 64 * 132 + 2 * 584)


def test_the_seed_fits_with_a_pool_and_tokens_in_range(seed_plan: Plan) -> None:
    assert seed_plan.fits
    assert 8_450 <= seed_plan.kv_bytes_per_token <= 9_200
    assert 19.5 <= seed_plan.kv_pool_gib <= 21.5
    assert 2_300_000 <= seed_plan.kv_pool_tokens <= 2_700_000
    assert seed_plan.max_concurrency > 3


def test_per_node_use_is_near_the_115_to_117_gb_the_seed_saw(seed_plan: Plan) -> None:
    assert 114e9 <= seed_plan.per_node_memory_bytes <= 118e9
    assert any("GUI" in n for n in seed_plan.notes)


def test_the_1_79m_claim_is_explained_not_hidden(seed_plan: Plan) -> None:
    [explanation] = seed_plan.explanations
    assert explanation.claimed_kv_pool_tokens == 1_790_000
    assert explanation.difference_pct > 20
    # 1.79M tokens need a 13-15 GiB pool: util ~0.80, or ~6 GiB more non-KV memory at 0.85.
    assert 13 <= explanation.implied_kv_pool_gib <= 15.5
    assert 0.78 <= explanation.equivalent_gpu_memory_utilization <= 0.82
    assert 5 <= explanation.extra_non_kv_gib <= 7.5
    assert "0.80" in explanation.text


def test_calibrated_against_the_shipped_boot_reproduces_it() -> None:
    plan = plan_at(max_model_len=1_048_576, gpu_memory_utilization=0.835)
    assert plan.kv_pool_gib == pytest.approx(18.08, abs=0.01)
    assert plan.kv_pool_tokens == pytest.approx(2_493_464, rel=0.001)


def test_without_calibration_the_arithmetic_is_within_7_percent_of_the_boot() -> None:
    plan = plan_at(max_model_len=1_048_576, gpu_memory_utilization=0.835, use_shipped_boots=False)
    assert plan.kv_pool_gib == pytest.approx(18.08, rel=0.07)
    assert plan.kv_pool_tokens == pytest.approx(2_493_464, rel=0.07)


def test_util_0_80_lands_near_the_12_94_gib_that_was_reported() -> None:
    plan = plan_at(max_model_len=1_048_576, gpu_memory_utilization=0.80)
    assert plan.kv_pool_gib == pytest.approx(12.94, rel=0.08)


def test_decode_roofline_is_an_upper_bound_over_the_measured_speeds(seed_plan: Plan) -> None:
    # Measured DSpark k=5: 14-15 steps/s, 50-60 tok/s (seed), 62-83 tok/s single stream.
    assert 16 <= seed_plan.roofline.single_stream.steps_per_s <= 21
    assert seed_plan.roofline.single_stream.allreduce_s_per_step == pytest.approx(86 * 29e-6)
    no_spec = plan_at(acceptance_rate=0.0)
    assert no_spec.decode_roofline_tok_s < seed_plan.decode_roofline_tok_s


def test_no_speculation_bound_is_about_47_steps_per_s_before_all_reduce() -> None:
    deployment = load_deployment(*SEED)
    serve = deployment.recipe.engine.serve.model_copy(update={"speculative_config": None})
    engine = deployment.recipe.engine.model_copy(update={"serve": serve})
    recipe = deployment.recipe.model_copy(update={"engine": engine})
    facts = load_model_facts(recipe.model.repo_id, cache_roots=[])
    plan = plan_deployment(
        deployment.model_copy(update={"recipe": recipe}), facts, load_profile("gb10")
    )
    point = plan.roofline.single_stream
    bandwidth_only = 1 / (point.step_s - point.allreduce_s_per_step)
    assert 44 <= bandwidth_only <= 50  # model-physics.md §5.2: 47.3 at 8K
    assert plan.weights_bytes_per_rank < 80 * GIB  # no drafter loaded without speculation


def test_too_long_a_context_does_not_fit_and_says_what_to_change() -> None:
    plan = plan_at(gpu_memory_utilization=0.72, max_model_len=1_048_576)
    assert not plan.fits
    assert plan.fit.largest_max_model_len_tokens < 1_048_576
    assert any("max_model_len" in c for c in plan.fit.changes)
    assert any("gpu_memory_utilization" in c for c in plan.fit.changes)


def test_cli_json_has_the_interface_fields_with_units() -> None:
    result = CliRunner().invoke(plan_command, [SEED[0], "--cluster", SEED[1], "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in (
        "weights_bytes_per_rank",
        "kv_bytes_per_token",
        "kv_pool_tokens",
        "max_concurrency",
        "fits",
        "decode_roofline_tok_s",
    ):
        assert key in data
    assert data["fits"] is True


def test_cli_table_shows_the_verdict_and_the_explanation() -> None:
    result = CliRunner().invoke(plan_command, [SEED[0], "--cluster", SEED[1]], terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "FITS" in result.output
    assert "explained:" in result.output
