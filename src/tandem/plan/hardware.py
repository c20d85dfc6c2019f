"""Hardware profiles: the memory, bandwidth and latency figures of one device kind, as data.

Profiles live in ``tandem/hardware/NAME.yaml``. Every figure is a ``{value, source}`` pair, so a
plan can say where each number came from; a source that starts with ``estimate`` or
``derived`` is labelled as such in the plan.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tandem.errors import PlanError


class Figure(BaseModel):
    """A number and where it comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float
    source: str


class HardwareProfile(BaseModel):
    """One device kind; a rank runs on one device."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    aliases: list[str] = Field(default_factory=list)
    device: Literal["cuda", "cpu"]
    unified_memory: bool = Field(
        description="CPU and GPU share one pool (GB10), so the OS and "
        "other processes compete with vLLM's budget."
    )
    memory_total_gib: Figure = Field(
        description="Memory the device reports (cudaMemGetInfo "
        "total), GiB; util x this is vLLM's budget."
    )
    memory_bandwidth_gb_s: Figure
    allreduce_latency_us: Figure
    outside_budget_gib: Figure | None = Field(
        default=None,
        description="Unified memory only: OS, page cache, CUDA context outside vLLM's budget.",
    )
    desktop_gui_gib: Figure | None = None
    max_gpu_memory_utilization: Figure | None = None
    non_torch_gib: Figure | None = None
    cudagraph_gib: Figure | None = None
    non_torch_tp_extra_gib: Figure | None = Field(
        default=None, description="More non-torch memory per rank once TP > 1 (NCCL buffers)."
    )
    default_max_num_batched_tokens: Figure | None = Field(
        default=None, description="vLLM's API-server default on this device."
    )
    default_max_num_seqs: Figure | None = None
    activation: Literal["scaled", "derived"] = Field(
        default="scaled",
        description="`scaled`: "
        "65 B per batched token per hidden unit (GB10), and `cudagraph_gib` flat; `derived`: "
        "vLLM 0.25.1's profile run walked buffer by buffer and its own CUDA-graph estimate "
        "(plan/profile_run.py), checked on H200 boots.",
    )
    sm_count: Figure | None = Field(
        default=None, description="Streaming multiprocessors: vLLM's sampler sizes a buffer by it."
    )
    mla_block_size: Figure | None = Field(
        default=None,
        description="KV block size vLLM picks for MLA on this device when the recipe sets none.",
    )
    kv_cache_space_env: str | None = Field(
        default=None, description="CPU only: the variable whose GiB become the KV pool."
    )


def profile_names() -> list[str]:
    folder = resources.files("tandem") / "hardware"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def listed_profiles(*, cpu: bool = True) -> list[str]:
    """The profiles as ``--hardware``'s help and hints list them, read from their own files so
    a new one shows everywhere: the GPUs from the slowest memory to the fastest, then the CPU
    backend (left out with ``cpu=False``, where the recipe is one for GPUs)."""
    profiles = [load_profile(name) for name in profile_names()]
    profiles.sort(key=lambda p: (p.device == "cpu", p.memory_bandwidth_gb_s.value))
    return [p.name for p in profiles if cpu or p.device != "cpu"]


def load_profile(name: str) -> HardwareProfile:
    """The profile called ``name`` (or one of its aliases).

    Raises:
        PlanError: no such profile.
    """
    folder = resources.files("tandem") / "hardware"
    for stem in profile_names():
        profile = HardwareProfile.model_validate(
            yaml.safe_load(folder.joinpath(f"{stem}.yaml").read_text())
        )
        if name.lower() in (profile.name, *profile.aliases):
            return profile
    raise PlanError(
        f"no hardware profile named '{name}'",
        field="--hardware",
        hint=f"use one of {', '.join(profile_names())}",
    )
