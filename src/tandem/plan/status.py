"""Planned versus actual for a running deployment: the plan of the recipe and cluster it was
launched with, against the KV figures ``tandem up`` recorded from the leader's log."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from tandem.backends.state import BootFigures
from tandem.errors import TandemError
from tandem.plan.calibrate import Calibration, planned_vs_measured
from tandem.plan.config import default_cache_roots, load_model_facts
from tandem.plan.planner import infer_hardware, plan_deployment
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import Recipe


class PlannedVsActual(BaseModel):
    """The comparison, or why there is none."""

    comparison: Calibration | None = None
    unavailable: str | None = None


def planned_vs_boot(recipe: dict[str, Any], cluster: dict[str, Any],
                    boot: BootFigures) -> PlannedVsActual:
    """Plan the launched deployment and compare it with its boot figures; never raises."""
    if boot.kv_cache_tokens is None:
        return PlannedVsActual(unavailable="the leader has not logged its KV cache size yet")
    try:
        deployment = Deployment(recipe=Recipe.model_validate(recipe),
                                cluster=Cluster.model_validate(cluster))
        model = deployment.recipe.model
        facts = load_model_facts(model.repo_id, revision=model.revision,
                                 cache_roots=default_cache_roots(model.cache_root),
                                 local_path=model.path)
        plan = plan_deployment(deployment, facts, infer_hardware(deployment, None))
    except (TandemError, ValidationError) as exc:
        return PlannedVsActual(unavailable=f"no plan: {str(exc).splitlines()[0]}")
    return PlannedVsActual(comparison=planned_vs_measured(
        kv_pool_bytes=plan.kv_pool_bytes, kv_pool_tokens=plan.kv_pool_tokens,
        max_concurrency=plan.max_concurrency, figures=boot, source="tandem up (leader log)"))
