"""nvidia-smi's CSV -> GPU readings, on the fixtures of tests/fixtures/watch (see its README).

The H200 files are the real output of the watched query on the lent H200 (2026-12-01, driver
580.159.04): idle, the busiest sample of a bench run, and that run's whole series.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.agent import NVIDIA_SMI_FIELDS
from tandem.watch.gpu import parse_nvidia_smi

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "watch"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_an_idle_h200_reports_every_field():
    [gpu] = parse_nvidia_smi(fixture("nvidia-smi-h200.csv"))
    assert gpu.index == 0 and gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-032d7472-a72d-5307-49f8-00aac99b3c8e"
    assert gpu.temperature_c == 37 and gpu.power_w == pytest.approx(79.53)
    assert (gpu.sm_clock_mhz, gpu.max_sm_clock_mhz) == (345, 1980)
    assert gpu.memory_used_bytes == 0 and gpu.memory_total_bytes == 143771 * 1024**2
    assert gpu.event_reasons == ["gpu_idle"] and not gpu.throttled


def test_an_h200_under_load_is_power_capped_not_throttled():
    [gpu] = parse_nvidia_smi(fixture("nvidia-smi-h200-load.csv"))
    assert gpu.utilization_pct == 100 and gpu.power_w == pytest.approx(567.71)
    assert gpu.memory_used_bytes == 130423 * 1024**2
    assert gpu.event_reasons == ["sw_power_cap"] and not gpu.throttled


def test_every_sample_of_a_recorded_bench_run_parses():
    """242 samples 2 s apart while tandem bench and vllm bench serve loaded the GPU."""
    blocks = fixture("nvidia-smi-h200-bench.txt").split("index, uuid")[1:]
    gpus = [g for block in blocks for g in parse_nvidia_smi("index, uuid" + block)]
    assert len(gpus) == 242
    assert max(g.temperature_c for g in gpus) == 54
    assert max(g.power_w for g in gpus) == pytest.approx(567.71)
    capped = [g for g in gpus if "sw_power_cap" in g.event_reasons]
    assert capped and not any(g.throttled for g in gpus)


def test_thermal_slowdown_counts_as_throttled_and_the_power_cap_is_named():
    [gpu] = parse_nvidia_smi(fixture("nvidia-smi-h200-throttled.documented.csv"))
    assert gpu.throttled
    assert gpu.event_reasons == ["sw_power_cap", "sw_thermal_slowdown"]
    assert gpu.temperature_c == 88 and gpu.memory_used_bytes == 131072 * 1024**2


def test_a_gb10_reports_no_memory_but_everything_else():
    [gpu] = parse_nvidia_smi(fixture("nvidia-smi-gb10.documented.csv"))
    assert gpu.memory_used_bytes is None and gpu.memory_total_bytes is None
    assert gpu.temperature_c == 61 and gpu.power_w == pytest.approx(41.87)
    assert gpu.event_reasons == [] and not gpu.throttled


def test_the_header_names_the_queried_fields_in_order():
    header = fixture("nvidia-smi-h200.csv").splitlines()[0]
    names = [
        h.strip().split(" [")[0].replace("clocks.current.sm", "clocks.sm")
        for h in header.split(",")
    ]
    assert names == list(NVIDIA_SMI_FIELDS)


@pytest.mark.parametrize("text", [None, "", "error: nvidia-smi has failed", "index, name\n"])
def test_no_gpu_lines_give_no_gpus(text):
    assert parse_nvidia_smi(text) == []
