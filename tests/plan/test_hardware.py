"""Hardware profiles: every one loads, every figure says where it comes from."""

from __future__ import annotations

import pytest

from tandem.errors import PlanError
from tandem.plan.hardware import load_profile, profile_names


def test_the_issue_s_profiles_ship() -> None:
    assert {"gb10", "h100", "h200", "b200", "gb200", "cpu"} <= set(profile_names())


@pytest.mark.parametrize("name", profile_names())
def test_every_figure_has_a_source(name: str) -> None:
    profile = load_profile(name)
    for field, value in profile:
        if hasattr(value, "source"):
            assert value.source.strip(), f"{name}.{field} has no source"


def test_gb10_is_unified_memory_with_the_memory_cuda_reports() -> None:
    gb10 = load_profile("dgx-spark")
    assert gb10.name == "gb10"
    assert gb10.unified_memory
    assert gb10.memory_total_gib.value == 121.69
    assert gb10.memory_bandwidth_gb_s.value == 273


def test_cpu_takes_its_kv_space_from_the_environment() -> None:
    assert load_profile("cpu").kv_cache_space_env == "VLLM_CPU_KVCACHE_SPACE"


def test_an_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(PlanError) as exc:
        load_profile("tpu-v9")
    assert "gb10" in exc.value.hint
