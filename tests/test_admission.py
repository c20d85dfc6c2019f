"""Admission of a deployment beside those already recorded on the same nodes
(``tandem.operations.admission``): memory by the plans, ports, subnets, cores and model names
apart; ``up --dry-run`` refuses the same, and ``up`` refuses before anything is written.

The running deployments are records only (nothing runs): admission reads what they hold from
their records, as it does beside real ones. The model is a folder with SmolLM2's config.json
and a safetensors header of its size (no weights: the planner reads headers only).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tandem.backends.state import DeploymentDir, DeploymentState, GroupState
from tandem.errors import PlanError
from tandem.operations import admission, lifecycle
from tandem.plan.memory import GIB
from tandem.spec.loading import load_deployment

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = 134_515_008  # SmolLM2-135M's parameters, bf16


def model_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    config = ROOT / "tests" / "fixtures" / "configs" / "smollm2-135m-instruct.json"
    (folder / "config.json").write_text(config.read_text())
    header = json.dumps(
        {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [WEIGHTS],
                                       "data_offsets": [0, 2 * WEIGHTS]}}
    ).encode()  # fmt: skip
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A state root, the model, and a writer of recipe + cluster pairs."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    model = model_folder(tmp_path / "model")

    def deployment(name: str, *, served: str | None = None, kv: int = 1, subnet: int = 0,
                   cpus: str | None = None, isolation: str = "netns", api: int = 8000,
                   master: int = 29501):  # fmt: skip
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(
            f"name: {name}\nmodel: {{repo_id: tandem-org/smollm2-135m-instruct, "
            f"path: {model}, served_name: {served or name}}}\n"
            "engine: {serve: {max_model_len: 2048, enforce_eager: true}}\n"
            f"env: {{VLLM_CPU_KVCACHE_SPACE: {kv}}}\nports: {{api: {api}, master: {master}}}\n"
        )
        address = "127.0.0.1" if isolation == "loopback" else f"10.213.{subnet}.1"
        pin = f", cpus: '{cpus}', env: {{VLLM_CPU_OMP_THREADS_BIND: '{cpus}'}}" if cpus else ""
        cluster = tmp_path / f"{name}-cluster.yaml"
        cluster.write_text(
            f"name: c-{name}\ntransport: local\n"
            f"local: {{isolation: {isolation}, subnet: 10.213.{subnet}.0/24}}\n"
            f"nodes:\n  - {{name: node0, address: {address}{pin}}}\n"
        )
        return load_deployment(recipe, cluster)

    return deployment


def record(deployment, *, network: dict | None = None) -> None:
    """What ``up`` writes before anything starts: the record with what its plan holds."""
    admitted = admission.admit(deployment, record=True)
    groups = []
    if network is not None:
        groups = [
            GroupState(
                name=deployment.name, backend="local", endpoint="http://10.213.0.1:8000",
                model=deployment.recipe.model.name_for_clients, network=network,
                recipe=deployment.recipe.model_dump(mode="json"),
                cluster=deployment.cluster.model_dump(mode="json"),
            )
        ]  # fmt: skip
    DeploymentState(
        name=deployment.name,
        backend="local",
        recipe=deployment.recipe.model_dump(mode="json"),
        cluster=deployment.cluster.model_dump(mode="json"),
        model=deployment.recipe.model.name_for_clients,
        holds=admitted.holds,
        groups=groups,
    ).write()


def refusal(deployment) -> PlanError:
    with pytest.raises(PlanError) as caught:
        admission.admit(deployment)
    return caught.value


def test_alone_it_plans_nothing_beside_and_records_what_it_holds(here):
    first = here("model-a", cpus="0")
    assert admission.admit(first).lines() == []
    held = admission.admit(first, record=True).holds
    assert [(h.node, h.host, h.kv_pool_bytes) for h in held] == [("node0", "this machine", GIB)]


def test_beside_another_it_is_admitted_with_the_ledger_and_what_was_kept_apart(here):
    record(here("model-a", cpus="0"))
    lines = admission.admit(here("model-b", subnet=1, cpus="1")).lines()
    assert lines[0].startswith("admitted beside model-a: this machine: 16.00 GiB; model-a 1.25")
    assert "cores 1 apart from the others' 0" in " ".join(lines)


def test_one_that_does_not_fit_is_refused_naming_the_node_the_term_and_by_how_much(here):
    record(here("model-a", cpus="0"))
    record(here("model-b", subnet=1, cpus="1"))
    refused = refusal(here("model-c", subnet=2, kv=14))
    (problem,) = refused.problems
    assert refused.node == "node0" and problem.field == "env.VLLM_CPU_KVCACHE_SPACE"
    assert "node node0 (this machine)" in problem.message
    assert "VLLM_CPU_KVCACHE_SPACE 14 GiB" in problem.message
    assert "beside model-a 1.25 GiB, model-b 1.25 GiB" in problem.message
    assert "16.75 GiB planned of 16.00 GiB, 0.75 GiB over" in problem.message
    assert problem.hint and problem.hint.startswith("lower VLLM_CPU_KVCACHE_SPACE from 14 to 13")
    assert admission.admit(here("model-c", subnet=2, kv=13)).holds  # the fix fits


def test_dry_run_refuses_the_same_and_up_refuses_before_anything_is_written(here, tandem_here):
    record(here("model-a", cpus="0"))
    crowded = here("model-c", subnet=2, kv=16)
    dry = tandem_here("up", crowded.recipe_file or "", "--cluster", crowded.cluster_file or "",
                      "--dry-run")  # fmt: skip
    assert dry.code == 2 and "env.VLLM_CPU_KVCACHE_SPACE: node node0 (this machine)" in dry.err
    events: list[str] = []
    with pytest.raises(PlanError):
        lifecycle.up(crowded, on_event=events.append)
    assert not DeploymentDir.of("model-c").state_file.exists() and events == []


def test_ports_on_one_address_are_refused_with_a_free_one_named(here):
    record(here("model-a", isolation="loopback"))
    refused = refusal(here("model-b", isolation="loopback"))
    fields = {p.field: p for p in refused.problems}
    assert set(fields) == {"ports.api", "ports.master"}
    assert "port 8000 on this machine is model-a's (ports.api)" in fields["ports.api"].message
    assert fields["ports.api"].hint == "set ports.api: 8001 (free of every deployment here)"
    apart = admission.admit(here("model-b", isolation="loopback", api=8001, master=29502))
    said = "ports apart from the others': ports.api 8001 on this machine, ports.master 29502 on"
    assert f"{said} this machine" in apart.apart


def test_a_subnet_another_deployment_made_is_refused_with_a_free_one_named(here):
    network = {"bridge": "tdmbabc", "bridge_address": "10.213.0.254", "prefix": 24, "nodes": []}
    record(here("model-a"), network=network)
    problems = {p.field: p for p in refusal(here("model-b")).problems}
    problem = problems["local.subnet"]  # (its leader's ports on the same address clash too)
    assert "subnet 10.213.0.0/24 overlaps deployment 'model-a''s network" in problem.message
    assert problem.hint and "10.213.0." not in problem.hint.split("(")[0]
    assert admission.admit(here("model-b", subnet=1)).apart  # another subnet is admitted


def test_a_core_another_deployment_runs_on_is_refused(here):
    record(here("model-a", cpus="0"))
    (problem,) = refusal(here("model-b", subnet=1, cpus="0")).problems
    assert problem.field == "nodes[0].cpus"
    assert "node node0 runs on core(s) 0, which node node0 of 'model-a' runs on" in problem.message


def test_two_deployments_never_serve_one_model_name(here):
    record(here("model-a", served="smollm2"))
    (problem,) = refusal(here("model-b", subnet=1, served="smollm2")).problems
    assert problem.field == "model.served_name"
    assert problem.hint == "set model.served_name: model-b"


def test_a_record_without_holds_is_planned_again_from_its_recipe(here):
    first = here("model-a", kv=3)
    DeploymentState(
        name=first.name, backend="local", recipe=first.recipe.model_dump(mode="json"),
        cluster=first.cluster.model_dump(mode="json"), model="model-a",
    ).write()  # fmt: skip
    (held,) = admission.recorded_holds(admission.others()[0])
    assert held.known and held.kv_pool_bytes == 3 * GIB
