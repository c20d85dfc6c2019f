"""The planner: memory per rank, KV pool in tokens, concurrency, fit and decode roofline.

Usage:
    from tandem.plan import load_model_facts, load_profile, plan_deployment
    from tandem.spec.loading import load_deployment

    deployment = load_deployment("deepseek-v4-flash-dspark", "examples/dgx-spark-eks.yaml")
    facts = load_model_facts(deployment.recipe.model.repo_id)
    plan = plan_deployment(deployment, facts, load_profile("gb10"))
    plan.kv_pool_tokens, plan.fits, plan.model_dump_json()

Modules: ``config`` (config.json and safetensors headers), ``kv`` (KV layout by architecture),
``memory`` (budget, weights, reserves, pool, fit), ``roofline`` (decode bound), ``calibrate``
(planned vs a real boot log), ``planner`` (the orchestration), ``hardware`` (profiles as data).
"""

from tandem.plan.calibrate import Calibration, figures_from_log, planned_vs_measured
from tandem.plan.config import ModelFacts, WeightPart, load_model_facts, read_safetensors_header
from tandem.plan.hardware import HardwareProfile, load_profile, profile_names
from tandem.plan.kv import KVLayout, kv_layout
from tandem.plan.planner import Plan, infer_hardware, plan_deployment

__all__ = [
    "Calibration",
    "HardwareProfile",
    "KVLayout",
    "ModelFacts",
    "Plan",
    "WeightPart",
    "figures_from_log",
    "infer_hardware",
    "kv_layout",
    "load_model_facts",
    "load_profile",
    "plan_deployment",
    "planned_vs_measured",
    "profile_names",
    "read_safetensors_header",
]
