"""The compile caches of the shared real deployment (tiny-local, two ranks): each rank's root is
where vLLM writes, `tandem check` finds a cache planted on one rank before a launch, `down`
keeps the caches and `down --purge-caches` clears them.

No extra engine boot: these tests use the session's deployment (``tiny_deployment``); the cold
vs warm timing with torch.compile on is ``benchmarks/warm_start.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine
DIGEST = "5eeded" + "0" * 58
"""A torch_aot_compile folder name no real boot of this deployment writes."""


def roots(deployment) -> list[Path]:
    base = deployment.state_dir.parent.parent / "caches" / deployment.name
    return [base / f"rank{r}" for r in (0, 1)]


def parity_findings(deployment) -> list[dict]:
    """The cache-parity findings of `tandem check` (the running deployment's own ports are
    reported taken too, so the exit status says nothing here)."""
    result = deployment.tandem("check", deployment.name, "--json", timeout=300, check=False)
    report = json.loads(result.stdout)
    return [f for f in report["findings"] if f["rule"] == "cache-parity"]


def test_each_rank_writes_its_own_cache_root_kept_apart_from_the_run_dir(tiny_deployment):
    state = json.loads((tiny_deployment.state_dir / "state.json").read_text())
    for root in roots(tiny_deployment):
        assert list((root / "vllm" / "modelinfos").iterdir()), root  # vLLM wrote here
        assert not str(root).startswith(state["groups"][0]["run_dir"])


def test_check_finds_a_cache_planted_on_one_rank_with_the_fix(tiny_deployment):
    findings = parity_findings(tiny_deployment)
    assert [f["severity"] for f in findings] == ["info"], findings
    planted = (
        roots(tiny_deployment)[1] / "vllm" / "torch_compile_cache" / "torch_aot_compile" / DIGEST
    )
    (planted / "rank_1_0").mkdir(parents=True)
    try:
        findings = parity_findings(tiny_deployment)
    finally:
        shutil.rmtree(planted)
        for folder in (planted.parent, planted.parent.parent):
            if not any(folder.iterdir()):
                folder.rmdir()
    (finding,) = findings
    assert finding["severity"] == "error" and finding["node"] == "node1"
    assert "only here: vllm/torch_compile_cache/torch_aot_compile" in finding["evidence"]
    assert f"tandem down {tiny_deployment.name} --purge-caches" in finding["fix"]


@pytest.mark.after_down
def test_down_keeps_the_caches_and_purge_clears_them(tiny_deployment):
    if (tiny_deployment.state_dir / "state.json").exists():  # this file run on its own
        tiny_deployment.tandem("down", tiny_deployment.name, timeout=300)
    assert all((root / "vllm").is_dir() for root in roots(tiny_deployment))
    result = tiny_deployment.tandem("down", tiny_deployment.name, "--purge-caches")
    assert "removed the compile caches of" in result.stdout
    assert not any(root.exists() for root in roots(tiny_deployment))
