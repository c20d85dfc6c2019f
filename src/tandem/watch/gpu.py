"""``nvidia-smi --query-gpu`` CSV -> ``GpuReading``s (pure).

The query is ``tandem.agent.COMMANDS["nvidia-smi-watch"]``: ``--format=csv,nounits``, one header
line, then one line per GPU with the fields of ``NVIDIA_SMI_FIELDS`` in order. Columns are read by
position, since the header's spelling changes between drivers (``clocks.sm`` prints as
``clocks.current.sm [MHz]``). A field a GPU does not report prints ``[N/A]`` or
``[Not Supported]`` and becomes None: on DGX Spark (GB10, unified memory) both memory fields do.

``clocks_event_reasons.active`` is NVML's bit mask of why the clocks are held down
(``nvmlClocksEventReasons``); ``THROTTLE_BITS`` are the ones that mean the GPU is slowed by heat
or by the board (not idle, not an application clock setting, not the power cap alone).
"""

from __future__ import annotations

from tandem.agent import NVIDIA_SMI_FIELDS
from tandem.watch.sample import GpuReading

EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
MIB = 1024**2


def parse_nvidia_smi(text: str | None) -> list[GpuReading]:
    """The GPUs in nvidia-smi's CSV; [] for no text, an error text or no GPU lines."""
    if not text or text.startswith("error:"):
        return []
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and not lines[0].split(",")[0].strip().isdigit():
        lines = lines[1:]  # the header
    gpus = []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(NVIDIA_SMI_FIELDS) or not cells[0].isdigit():
            continue
        row = dict(zip(NVIDIA_SMI_FIELDS, cells))
        mask = _mask(row["clocks_event_reasons.active"])
        used, total = _number(row["memory.used"]), _number(row["memory.total"])
        gpus.append(
            GpuReading(
                index=int(row["index"]),
                name=_text(row["name"]),
                uuid=_text(row["uuid"]),
                temperature_c=_number(row["temperature.gpu"]),
                sm_clock_mhz=_number(row["clocks.sm"]),
                max_sm_clock_mhz=_number(row["clocks.max.sm"]),
                power_w=_number(row["power.draw"]),
                utilization_pct=_number(row["utilization.gpu"]),
                memory_used_bytes=round(used * MIB) if used is not None else None,
                memory_total_bytes=round(total * MIB) if total is not None else None,
                event_reasons_mask=mask,
                event_reasons=[name for bit, name in EVENT_REASONS.items() if mask and mask & bit],
                throttled=bool(mask and mask & THROTTLE_BITS),
            )
        )
    return gpus


def _unreported(cell: str) -> bool:
    return cell.startswith("[") or cell in ("N/A", "")


def _text(cell: str) -> str | None:
    return None if _unreported(cell) else cell


def _number(cell: str) -> float | None:
    if _unreported(cell):
        return None
    try:
        return float(cell.split()[0])
    except (ValueError, IndexError):
        return None


def _mask(cell: str) -> int | None:
    if _unreported(cell):
        return None
    try:
        return int(cell, 16) if cell.lower().startswith("0x") else int(cell)
    except ValueError:
        return None
