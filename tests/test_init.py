"""``tandem init``: a recipe and a cluster for a model tandem ships no recipe for, planned
before they are written (newcomer review, defect 4; issue 47 §2)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tandem.cli import cli
from tandem.cli import init as init_cli
from tandem.errors import BackendError
from tandem.operations import drafting
from tandem.plan.planner import plan_for
from tandem.spec.loading import load_deployment

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"
QWEN_7B = (
    "--model",
    "Qwen/Qwen2.5-7B-Instruct",
    "--config",
    str(CONFIGS / "qwen2.5-7b-instruct.json"),
)
"""A hub model planned from its shipped config.json, never downloaded."""


def snapshot(folder: Path, config: str) -> Path:
    """A model folder: a real config.json and one safetensors file of a header only."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((CONFIGS / config).read_text())
    header = b'{"model.embed_tokens.weight":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}'
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    return folder


@pytest.mark.parametrize(
    ("config", "tp", "pp"),
    [("gemma3-270m.json", 2, 1), ("smollm2-135m-instruct.json", 1, 2)],
)
def test_the_parallelism_follows_the_heads_then_the_layers(tmp_path, tandem_here, config, tp, pp):
    """Gemma 3's 4 heads split in two; SmolLM2's 9 do not, its 30 layers do."""
    model = snapshot(tmp_path / "model", config)
    result = tandem_here("init", "mine", "--model", str(model), "--out", str(tmp_path / "o"))
    assert result.code == 0, result.err
    recipe, cluster = tmp_path / "o" / "mine.yaml", tmp_path / "o" / "mine-cluster.yaml"
    serve = yaml.safe_load(recipe.read_text())["engine"]["serve"]
    assert serve.get("tensor_parallel_size", 1) == tp
    assert serve.get("pipeline_parallel_size", 1) == pp
    deployment = load_deployment(recipe, cluster)  # what it wrote loads, and fits
    assert plan_for(deployment, model_dir=model, hardware="cpu").fits
    assert f"tandem up {recipe} --cluster {cluster}" in result.out


def test_a_hub_model_not_downloaded_is_planned_from_its_config(tmp_path, tandem_here):
    result = tandem_here(
        "init",
        *QWEN_7B,
        "--hardware",
        "cpu",
        "--ranks",
        "4",
        "--dry-run",
        "--json",
    )
    assert result.code == 0, result.err
    found = json.loads(result.out)
    assert found["name"] == "qwen2-5-7b-instruct" and found["fits"]
    assert (found["tensor_parallel_size"], found["pipeline_parallel_size"]) == (4, 1)
    assert found["recipe"]["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_a_request_that_does_not_fit_is_lowered_until_it_does(tmp_path, tandem_here):
    """1 GiB of CPU KV cache holds ~18.7k Qwen-7B tokens on one rank (56 KiB a token): 32K
    is lowered to what fits."""
    result = tandem_here(
        "init",
        *QWEN_7B,
        "--hardware",
        "cpu",
        "--ranks",
        "1",
        "--max-model-len",
        "32768",
        "--dry-run",
        "--json",
    )
    found = json.loads(result.out)
    assert 18_000 < found["max_model_len"] < 19_000 and found["fits"]


def test_ssh_nodes_are_asked_for_their_interface_and_gpus(monkeypatch, tmp_path, tandem_here):
    def facts(deployment, transport):
        return {
            node.name: {
                "interfaces": [
                    {"name": "lo", "addresses": ["127.0.0.1"]},
                    {"name": "enP7s7", "addresses": [f"{node.address}/24"]},
                ],
                "gpu": {"gpus": [{"name": "NVIDIA GB10"}]},
            }
            for node in deployment.cluster.nodes
        }

    monkeypatch.setattr(drafting, "probe_all", facts)
    result = tandem_here(
        "init",
        "q",
        *QWEN_7B,
        "--hosts",
        "spark-a=10.0.0.1,spark-b=10.0.0.2",
        "--out",
        str(tmp_path),
    )
    assert result.code == 0, result.err
    cluster = yaml.safe_load((tmp_path / "q-cluster.yaml").read_text())
    assert cluster["transport"] == "ssh"
    assert [n["control_plane_interface"] for n in cluster["nodes"]] == ["enP7s7", "enP7s7"]
    recipe = yaml.safe_load((tmp_path / "q.yaml").read_text())
    assert recipe["engine"]["serve"]["gpu_memory_utilization"] == 0.87  # what a GB10 starts with
    assert "on gb10" in result.out


def test_an_unreachable_node_is_named_and_the_rest_still_written(
    monkeypatch, tmp_path, tandem_here
):
    def unreachable(deployment, transport):
        raise BackendError("cannot reach 10.0.0.1: Connection timed out")

    monkeypatch.setattr(drafting, "probe_all", unreachable)
    result = tandem_here(
        "init",
        "q",
        *QWEN_7B,
        "--hosts",
        "10.0.0.1,10.0.0.2",
        "--hardware",
        "h100",
        "--out",
        str(tmp_path),
    )
    assert result.code == 0, result.err
    assert "not reachable" in result.err and "control_plane_interface" in result.err


def test_a_model_tandem_builds_is_asked_to_be_built_first(tmp_path, tandem_here, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    result = tandem_here("init", "--model", "tandem-org/gemma3-270m", "--dry-run")
    assert result.code == 2
    assert "tandem model real gemma3-270m" in result.err


def test_files_already_there_are_never_replaced(tmp_path, tandem_here):
    model = snapshot(tmp_path / "model", "gemma3-270m.json")
    (tmp_path / "mine.yaml").write_text("mine\n")
    result = tandem_here("init", "mine", "--model", str(model), "--out", str(tmp_path))
    assert result.code == 2 and "replaces no file" in result.err
    assert (tmp_path / "mine.yaml").read_text() == "mine\n"
    assert not (tmp_path / "mine-cluster.yaml").exists()


def test_without_a_terminal_the_model_is_a_flag(tandem_here):
    result = tandem_here("init")
    assert result.code == 2 and "--model" in result.err


def test_on_a_terminal_it_asks_for_the_model_the_hosts_and_the_name(monkeypatch, tmp_path):
    model = snapshot(tmp_path / "model", "gemma3-270m.json")
    monkeypatch.setattr(init_cli, "on_terminal", lambda: True)
    answers = f"{model}\n\nasked\n"
    result = CliRunner().invoke(cli, ["init", "--out", str(tmp_path / "o")], input=answers)
    assert result.exit_code == 0, result.output
    assert "Model (a Hub repo id" in result.output and "Deployment name [model]" in result.output
    assert (tmp_path / "o" / "asked.yaml").is_file()


@pytest.mark.parametrize(
    ("ranks", "subnet", "room"), [("254", "10.77.0.0/24", 253), ("14", "10.9.0.0/28", 13)]
)
def test_more_ranks_than_this_machine_has_nodes_names_the_flag(tandem_here, ranks, subnet, room):
    """``local_cluster`` refuses past its subnet, the bridge's address left out, for init too
    (an IndexError there before, or a node given the bridge's address on a small --subnet)."""
    result = tandem_here(
        "init",
        *QWEN_7B,
        "--hardware",
        "cpu",
        "--ranks",
        ranks,
        "--subnet",
        subnet,
        "--dry-run",
    )
    assert result.code == 2, result.err
    assert (
        f"--ranks: {ranks} ranks" in result.err and f"which holds {room} on {subnet}" in result.err
    )
    assert "--subnet" in result.err.split("which holds")[1]
