"""Revisions without an engine: what is recorded, what changed, a host fact that moved, and
the bench part of an upgrade's gate."""

from __future__ import annotations

import pytest
from bench.test_speed_gate import rounds
from factories import LOOPBACK_CLUSTER, launched_local_state

from tandem.check.findings import CheckReport
from tandem.errors import SpecError, StateError
from tandem.operations import revisions
from tandem.spec.loading import load_deployment
from tandem.upgrade import GateLimits, judge_speed, upgrade

FACTS = {
    "system": {"kernel": "6.17.0-1026-nvidia"},
    "gpu": {"driver_version": "580.95", "cuda_version": "13.0"},
    "software": {"packages": {"nvidia-nccl-cu13": "2.28.3"}, "vllm_version": "0.25.1"},
    "rdma": {"devices": [{"name": "rocep1s0f0", "fw_ver": "28.45.1020"}]},
    "model": {"commit": "abc123"},
}


def test_host_facts_are_read_from_the_probe():
    facts = revisions.host_facts(FACTS)
    assert facts.named() == {
        "kernel": "6.17.0-1026-nvidia",
        "GPU driver": "580.95",
        "CUDA": "13.0",
        "NCCL": "2.28.3",
        "vLLM": "0.25.1",
        "model snapshot": "abc123",
        "NIC rocep1s0f0 firmware": "28.45.1020",
    }
    assert revisions.host_facts({"system": None, "gpu": None}).named() == {}


@pytest.fixture
def deployment(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    (tmp_path / "c.yaml").write_text(LOOPBACK_CLUSTER)
    return load_deployment("tiny-local", tmp_path / "c.yaml")


def report(deployment, kernel: str) -> CheckReport:
    nodes = {n.name: FACTS | {"system": {"kernel": kernel}} for n in deployment.cluster.nodes}
    return CheckReport(deployment=deployment.name, nodes=nodes)


def hosts(deployment, kernel: str) -> dict:
    return report(deployment, kernel).nodes


def test_each_up_is_the_next_revision_and_the_changes_are_named(deployment):
    first = revisions.record(deployment, hosts(deployment, "6.17.0-1026"))
    changed = deployment.model_copy(
        update={
            "recipe": deployment.recipe.model_copy(update={"description": "new", "shm_size": "2g"})
        }
    )
    second = revisions.record(
        changed, hosts(deployment, "7.0.0-1019"), outcome=revisions.RevisionOutcome.FAILED
    )
    assert [r.number for r in revisions.history("tiny-local")] == [1, 2]
    assert (first.outcome, second.outcome) == ("good", "failed")
    said = revisions.changes(first, second)
    assert "recipe.shm_size: '1g' -> '2g'" in said
    assert "kernel 6.17.0-1026 -> 7.0.0-1019 on n0" in said


def test_a_host_fact_changed_since_the_last_good_revision_is_a_warning(deployment):
    revisions.record(deployment, hosts(deployment, "6.17.0-1026"))
    found = revisions.host_changes("tiny-local", report(deployment, "7.0.0-1019"))
    assert {f.node for f in found} == {"n0", "n1"}
    assert found[0].message == (
        "kernel 6.17.0-1026 -> 7.0.0-1019 on n0 since revision 1, the last good one"
    )
    assert revisions.host_changes("tiny-local", report(deployment, "6.17.0-1026")) == []


def test_an_unknown_revision_is_one_message(deployment):
    revisions.record(deployment, {})
    with pytest.raises(StateError, match=r"no revision 7 \(known: 1\)"):
        revisions.revision("tiny-local", 7)


SPEED = [0.200, 0.050, 0.051, 0.049, 0.050, 0.052]  # a slow warm-up round, then 50 ms


@pytest.mark.parametrize(
    "new,passed,again",
    [
        ([0.300, 0.052, 0.050, 0.051, 0.049, 0.051], True, False),  # the same, fresh warm-up
        ([0.300, 0.101, 0.099, 0.100, 0.102, 0.098], False, False),  # twice as slow
        ([0.300, 0.040, 0.090, 0.045, 0.080, 0.050], True, True),  # the noise, measured again
    ],
    ids=["same speed", "twice as slow", "cannot tell twice"],
)
def test_the_gate_holds_the_new_revision_to_the_baselines_rounds_beyond_their_noise(
    new, passed, again
):
    asked: list[str] = []

    def measured(folder: str):
        asked.append(folder)
        return rounds(new)

    result = judge_speed([rounds(SPEED)], measured, GateLimits())
    assert result.passed is passed, result.evidence
    assert asked == (["bench", "bench-again"] if again else ["bench"])
    assert passed or (result.check or "").startswith("bench: slower than the limit")
    assert result.figures["tpot_p50_s"] > 0


def test_a_failed_request_of_the_new_revision_fails_the_gate():
    result = judge_speed([rounds(SPEED)], lambda folder: rounds(SPEED, failed=1), GateLimits())
    assert not result.passed and "request(s) of the new revision failed" in (result.check or "")


def test_an_upgrade_to_another_deployment_is_refused_first(deployment, tmp_path):
    launched_local_state(tmp_path)  # tiny-local runs (as far as its record says)
    other = deployment.model_copy(
        update={"recipe": deployment.recipe.model_copy(update={"name": "other"})}
    )
    with pytest.raises(SpecError, match="not 'tiny-local'"):
        upgrade("tiny-local", other)


def test_an_upgrade_of_what_does_not_run_is_refused(deployment):
    with pytest.raises(StateError, match="no deployment named 'tiny-local'"):
        upgrade("tiny-local", deployment)


def test_the_history_of_an_unknown_deployment_is_an_error_not_an_empty_list(deployment):
    with pytest.raises(StateError, match="no deployment named 'nosuch'"):
        revisions.history("nosuch")
    revisions.folder("odd").path.mkdir(parents=True)
    (revisions.folder("odd").path / "revisions").write_text("")
    with pytest.raises(StateError, match="is no folder"):
        revisions.history("odd")


def test_a_killed_upgrade_is_named_with_the_way_back(deployment):
    from tandem import files
    from tandem.backends.state import DeploymentDir
    from tandem.operations import lifecycle

    assert revisions.interrupted_upgrade("tiny-local") is None
    files.private_dir(DeploymentDir.of("tiny-local").path)
    revisions.mark_upgrade("tiny-local", 3, "gate")
    path = DeploymentDir.of("tiny-local").path / revisions.MARKER
    assert path.stat().st_mode & 0o777 == 0o600  # private, like the state beside it
    marker = revisions.UpgradeMarker(from_revision=3, phase="gate")
    assert revisions.interrupted_upgrade("tiny-local") == marker
    said = lifecycle._interrupted_upgrade("tiny-local")
    assert said and "from revision 3 was interrupted (gate)" in said and "--to 3" in said
    revisions.clear_upgrade("tiny-local")
    assert revisions.interrupted_upgrade("tiny-local") is None
