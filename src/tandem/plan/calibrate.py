"""Planned versus measured: a real vLLM boot log against the plan, and shipped observations.

``planned_vs_measured`` reads the figures vLLM prints while booting (``Available KV cache
memory`` or the CPU's ``Explicitly set (X/Y) GiB for KV cache``, ``KV cache size: N tokens``,
``Maximum concurrency for L tokens per request: Cx``) with ``tandem.vllm_log.BootLog`` and
reports the planner's error on each, as ``(planned - measured) / measured``. A log of another
model calibrates nothing: ``serves_model`` tells whether the log is of the deployment's.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Protocol

from pydantic import BaseModel, Field

from tandem.plan.memory import GIB
from tandem.spec.recipe import ModelSource
from tandem.vllm_log import BootFigures, BootLog


class Comparison(BaseModel):
    """One figure, planned and measured."""

    name: str
    planned: float | None
    measured: float | None
    error_pct: float | None = Field(description="(planned - measured) / measured x 100.")


class Calibration(BaseModel):
    """The planner's error against one vLLM boot."""

    source: str
    kv_pool_gib: Comparison
    kv_pool_tokens: Comparison
    max_concurrency: Comparison


def figures_from_log(text: str) -> BootFigures:
    """The memory figures of a vLLM boot log (the leader's, or any rank's)."""
    log = BootLog(rank=0)
    for line in text.splitlines():
        log.feed(line)
    return log.figures


def serves_model(logged: str, model: ModelSource) -> bool:
    """Whether the model a boot log names (``tandem.vllm_log.logged_model``) is ``model``: its
    repo id, its local path, or a snapshot inside its Hugging Face cache folder
    (``hub/models--ORG--NAME``, as ``tandem.hf_cache`` lays it out)."""
    if logged in (model.repo_id, model.path):
        return True
    return "models--" + model.repo_id.replace("/", "--") in PurePosixPath(logged).parts


def compare(name: str, planned: float | None, measured: float | None) -> Comparison:
    error = None
    if planned is not None and measured:
        error = round((planned - measured) / measured * 100, 3)
    return Comparison(name=name, planned=planned, measured=measured, error_pct=error)


class Planned(Protocol):
    """The figures of a plan (``tandem.plan.planner.Plan``) that a boot is compared on."""

    kv_pool_bytes: int
    kv_pool_tokens: int
    max_concurrency: float


def planned_vs_measured(plan: Planned, figures: BootFigures, source: str) -> Calibration:
    """Compare the plan's KV pool, tokens and concurrency with what vLLM printed."""
    return Calibration(
        source=source,
        kv_pool_gib=compare(
            "KV pool, GiB", round(plan.kv_pool_bytes / GIB, 3), figures.available_kv_cache_gib
        ),
        kv_pool_tokens=compare(
            "KV cache size, tokens", plan.kv_pool_tokens, figures.kv_cache_tokens
        ),
        max_concurrency=compare(
            "max concurrency", round(plan.max_concurrency, 2), figures.max_concurrency
        ),
    )
