"""``tandem status`` planned vs actual, from a saved deployment state (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

from tandem.plan.status import planned_vs_boot
from tandem.spec.loading import load_deployment
from tandem.vllm_log import BootFigures
from tests.plan.tiny import FIXTURES


def test_planned_vs_actual_for_a_recorded_tiny_local_boot(tmp_path: Path, monkeypatch) -> None:
    repo = tmp_path / "hub" / "models--tandem-org--tiny-deepseek-v3"
    snapshot = repo / "snapshots" / "c0ffee"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c0ffee")
    (snapshot / "config.json").write_text(
        (FIXTURES / "tiny-configs" / "deepseek-v3.json").read_text()
    )
    header = json.dumps(
        {"lm_head.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}
    ).encode()
    (snapshot / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0\0"
    )
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    deployment = load_deployment("tiny-local")
    boot = BootFigures(available_kv_cache_gib=1.0, kv_cache_tokens=310_688, max_concurrency=303.41)
    result = planned_vs_boot(
        deployment.recipe.model_dump(mode="json"), deployment.cluster.model_dump(mode="json"), boot
    )
    assert result.comparison is not None, result.unavailable
    assert result.comparison.kv_pool_tokens.error_pct == 0


def test_without_a_kv_line_it_says_so() -> None:
    deployment = load_deployment("tiny-local")
    result = planned_vs_boot(
        deployment.recipe.model_dump(mode="json"),
        deployment.cluster.model_dump(mode="json"),
        BootFigures(),
    )
    assert result.comparison is None and "not logged" in result.unavailable


def test_a_model_that_cannot_be_found_is_reported_not_raised(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    deployment = load_deployment("tiny-local")
    result = planned_vs_boot(
        deployment.recipe.model_dump(mode="json"),
        deployment.cluster.model_dump(mode="json"),
        BootFigures(kv_cache_tokens=1),
    )
    assert result.comparison is None and result.unavailable.startswith("no plan")
