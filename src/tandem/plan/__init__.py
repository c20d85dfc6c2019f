"""The planner: memory per rank, KV pool in tokens, concurrency, fit and decode roofline.

Usage:
    from tandem.plan import plan_for
    from tandem.spec.loading import load_deployment

    deployment = load_deployment("deepseek-v4-flash-dspark", "examples/dgx-spark-eks.yaml")
    plan = plan_for(deployment, hardware="gb10")  # the model found where the recipe says
    plan.kv_pool_tokens, plan.fits, plan.model_dump_json()

``plan_deployment`` takes the model's facts and a hardware profile given by hand.

Modules: ``config`` (config.json and safetensors headers), ``kv`` (KV layout by architecture),
``memory`` (budget, weights, reserves, pool, fit), ``roofline`` (decode bound), ``calibrate``
(planned vs a real boot log), ``planner`` (the orchestration), ``hardware`` (profiles as data).
"""

from tandem.plan.calibrate import Calibration, figures_from_log, planned_vs_measured
from tandem.plan.config import ModelFacts, WeightPart, load_model_facts, read_safetensors_header
from tandem.plan.hardware import HardwareProfile, load_profile, profile_names
from tandem.plan.kv import KVLayout, kv_layout
from tandem.plan.planner import Plan, infer_hardware, plan_deployment, plan_for

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
    "plan_for",
    "planned_vs_measured",
    "profile_names",
    "read_safetensors_header",
]
