"""Planned versus actual for a running deployment: the plan of the recipe and cluster it was
launched with, against the KV figures ``tandem up`` recorded from the leader's log, and against
the decode speed ``tandem bench`` measures (the roofline)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from tandem.errors import TandemError
from tandem.plan.calibrate import Calibration, planned_vs_measured
from tandem.plan.planner import Plan, plan_for
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import Recipe
from tandem.vllm_log import BootFigures


class PlannedVsActual(BaseModel):
    """The comparison, or why there is none."""

    comparison: Calibration | None = None
    unavailable: str | None = None


def launched_plan(recipe: dict[str, Any], cluster: dict[str, Any]) -> Plan:
    """The plan of a launched deployment, from the recipe and cluster its state saved.

    Raises:
        TandemError, ValidationError: the model's facts cannot be read, or the saved
            recipe or cluster no longer validates.
    """
    deployment = Deployment(
        recipe=Recipe.model_validate(recipe), cluster=Cluster.model_validate(cluster)
    )
    return plan_for(deployment)


def planned_roofline_tok_s(recipe: dict[str, Any], cluster: dict[str, Any]) -> float | None:
    """The planner's single-stream decode bound for a launched deployment; None without a plan."""
    try:
        return launched_plan(recipe, cluster).decode_roofline_tok_s
    except (TandemError, ValidationError):
        return None


def planned_vs_boot(
    recipe: dict[str, Any], cluster: dict[str, Any], boot: BootFigures
) -> PlannedVsActual:
    """Plan the launched deployment and compare it with its boot figures; never raises."""
    if boot.kv_cache_tokens is None:
        return PlannedVsActual(unavailable="the leader has not logged its KV cache size yet")
    try:
        plan = launched_plan(recipe, cluster)
    except (TandemError, ValidationError) as exc:
        return PlannedVsActual(unavailable=f"no plan: {str(exc).splitlines()[0]}")
    return PlannedVsActual(comparison=planned_vs_measured(plan, boot, "tandem up (leader log)"))
