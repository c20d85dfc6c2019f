"""nvidia-smi's CSV -> GPU readings, on the fixtures of tests/fixtures/watch (see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.watch.gpu import parse_nvidia_smi
from tandem.watch.host import NVIDIA_SMI_FIELDS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "watch"


def fixture(name: str) -> str:
    recorded = FIXTURES / name.replace(".documented", "")
    return (recorded if recorded.is_file() else FIXTURES / name).read_text()


def test_an_h200_reports_every_field():
    [gpu] = parse_nvidia_smi(fixture("nvidia-smi-h200.documented.csv"))
    assert gpu.index == 0 and gpu.name == "NVIDIA H200"
    assert gpu.temperature_c is not None and 0 < gpu.temperature_c < 100
    assert gpu.sm_clock_mhz and gpu.max_sm_clock_mhz and gpu.sm_clock_mhz <= gpu.max_sm_clock_mhz
    assert gpu.power_w and gpu.power_w > 0
    assert gpu.memory_total_bytes and gpu.memory_total_bytes > 100 * 1024**3
    assert gpu.event_reasons_mask is not None and not gpu.throttled


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
    header = fixture("nvidia-smi-h200.documented.csv").splitlines()[0]
    names = [
        h.strip().split(" [")[0].replace("clocks.current.sm", "clocks.sm")
        for h in header.split(",")
    ]
    assert names == list(NVIDIA_SMI_FIELDS)


@pytest.mark.parametrize("text", [None, "", "error: nvidia-smi has failed", "index, name\n"])
def test_no_gpu_lines_give_no_gpus(text):
    assert parse_nvidia_smi(text) == []
