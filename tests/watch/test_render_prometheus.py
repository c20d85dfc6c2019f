"""``tandem render --target prometheus``: promtool accepts the files, and the rules fire on the
series they are written for (``promtool test rules``, Prometheus' own rule evaluator)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from tandem.cli import main

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"),
    reason="promtool is installed by .ci/run",
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("prom")
    code = main(
        [
            "render",
            "deepseek-v4-flash-dspark",
            "--cluster",
            "examples/dgx-spark-pair.yaml",
            "--target",
            "prometheus",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


def test_promtool_accepts_the_config_and_the_rules(rendered):
    for kind, name in (("config", "prometheus.yml"), ("rules", "tandem-rules.yml")):
        done = subprocess.run(
            ["promtool", "check", kind, str(rendered / name)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((rendered / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"vllm", "tandem-watch"}
    assert jobs["vllm"]["static_configs"][0]["labels"]["rank"] == "0"
    assert config["global"]["scrape_interval"] == "5s"
    assert "Grafana" in (rendered / "README.md").read_text()


def test_the_rules_fire_on_a_dead_rank_a_stall_and_a_hot_gpu(rendered, tmp_path):
    d = 'deployment="deepseek-v4-flash-dspark"'
    tests = {
        "rule_files": [str(rendered / "tandem-rules.yml")],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": [
                    {
                        "series": f'tandem_rank_up{{{d},rank="0",node="spark-101",role="leader"}}',
                        "values": "1x20",
                    },
                    {
                        "series": f'tandem_rank_up{{{d},rank="1",node="spark-102",role="worker"}}',
                        "values": "1 1 0x18",
                    },
                    {"series": f"vllm:num_requests_running{{{d}}}", "values": "2x40"},
                    {"series": f"vllm:generation_tokens_total{{{d}}}", "values": "100x40"},
                    {
                        "series": f'tandem_gpu_temperature_celsius{{{d},node="spark-101",gpu="0"}}',
                        "values": "90x40",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "5s", "alertname": "TandemRankDown", "exp_alerts": []},
                    {
                        "eval_time": "40s",
                        "alertname": "TandemRankDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "deployment": "deepseek-v4-flash-dspark",
                                    "rank": "1",
                                    "node": "spark-102",
                                    "role": "worker",
                                },
                                "exp_annotations": {
                                    "summary": "rank 1 (worker on spark-102) of deepseek-v4-flash-dspark is down",  # noqa: E501 - the rendered text, whole
                                    "description": "vLLM cannot heal a group: the leader may still answer "  # noqa: E501 - the rendered text, whole
                                    "/health, but the next request fails. Restart the whole "
                                    "group (`tandem supervise` does it).",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "3m20s",
                        "alertname": "TandemDeploymentStalled",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical"},
                                "exp_annotations": {
                                    "summary": "deepseek-v4-flash-dspark has requests running but produces no token",  # noqa: E501 - the rendered text, whole
                                    "description": "A collective hangs (a dead peer, NCCL) or the engine is "  # noqa: E501 - the rendered text, whole
                                    "stuck; see the ranks' logs for NCCL watchdog or "
                                    "EngineDeadError.",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "2m30s",
                        "alertname": "TandemGpuHot",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "deployment": "deepseek-v4-flash-dspark",
                                    "node": "spark-101",
                                    "gpu": "0",
                                },
                                "exp_annotations": {
                                    "summary": "GPU 0 on spark-101 is at 90 °C",
                                    "description": "Above the recipe's watch.max_temperature_c (85 °C).",  # noqa: E501 - the rendered text, whole
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "rules.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_deployment_with_replicas_is_scraped_at_every_groups_leader(tmp_path, monkeypatch):
    """Newcomer review, defect 14: replicas were refused; each group's leader is a target of
    its own, labelled with the deployment and its group, and promtool accepts it."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    out = tmp_path / "prom"
    assert main(["render", "smollm2-replicas", "--target", "prometheus", "--out", str(out)]) == 0
    done = subprocess.run(
        ["promtool", "check", "config", str(out / "prometheus.yml")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    (vllm,) = [job for job in config["scrape_configs"] if job["job_name"] == "vllm"]
    assert [(c["labels"]["deployment"], c["labels"]["group"]) for c in vllm["static_configs"]] == [
        ("smollm2-replicas", "0"),
        ("smollm2-replicas", "1"),
    ]
    assert len({c["targets"][0] for c in vllm["static_configs"]}) == 2
    assert (
        main(["render", "smollm2-replicas", "--target", "grafana", "--out", str(tmp_path / "g")])
        == 0
    )
