"""``tandem.operations.lifecycle.up`` holds the launch policy, so a script gets the CLI's checks:
it refuses on a preflight error before anything starts, and says what the preflight found."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tandem import wire
from tandem.backends.launch import new_state, record_rank
from tandem.backends.state import list_deployments
from tandem.check import CheckReport
from tandem.cli.lifecycle import first_answer
from tandem.errors import CheckFailed
from tandem.operations import lifecycle
from tandem.rankplan import plan_ranks
from tandem.readiness import Readiness
from tandem.spec.loading import load_deployment
from tandem.vllm_log import BootFigures

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = (
    "name: here\ntransport: local\nlocal: {isolation: loopback}\n"
    "nodes:\n  - {name: n0, address: 127.0.0.1}\n  - {name: n1, address: 127.0.0.1}\n"
)


def test_a_library_up_refuses_what_the_preflight_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VLLM_API_KEY", "k" * 8)
    (tmp_path / "loopback.yaml").write_text(LOOPBACK)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        (ROOT / "src/tandem/recipes/deepseek-v4-flash-dspark.yaml")
        .read_text()
        .replace("max_model_len: 524288", "max_model_len: 2000000")
        .replace("api: 8888", "api: 18888")
        .replace("master: 25000", "master: 35000")
    )
    deployment = load_deployment(recipe, tmp_path / "loopback.yaml")
    reports: list[CheckReport] = []
    events: list[str] = []
    with pytest.raises(CheckFailed) as caught:
        lifecycle.up(deployment, timeout_s=1, on_event=events.append, on_report=reports.append)
    assert f"refusing to launch '{deployment.name}'" in caught.value.message
    ((report,),) = [reports]
    assert "plan-does-not-fit" in {f.rule for f in report.errors}
    assert not any("started rank" in e for e in events), events
    assert not (tmp_path / "home" / "deployments" / deployment.name / "state.json").exists()


def test_up_counts_the_tokens_of_a_first_answer_that_decodes_to_no_text():
    said = {
        (text, tokens): first_answer(Readiness([], BootFigures(), text, tokens))
        for text, tokens in (("hello there", 2), ("", 8), ("", 0))
    }
    assert said[("hello there", 2)] == "first answer (2 tokens): 'hello there'"
    assert said[("", 8)] == "first answer: 8 tokens that decode to no text"
    assert said[("", 0)] == "first answer (0 tokens): ''"


def test_up_first_stops_what_a_killed_up_left_and_says_so(tmp_path, monkeypatch):
    """A rank that outlived its killed ``up`` holds the deployment's ports: the next ``up``
    stops it before its preflight would refuse those ports (a marked ``sleep`` plays the rank)."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    (tmp_path / "loopback.yaml").write_text(LOOPBACK)
    deployment = load_deployment("tiny-local", tmp_path / "loopback.yaml")
    plan = plan_ranks(deployment)
    state = new_state(plan, deployment, backend="local")
    state.launcher_start_ticks = (state.launcher_start_ticks or 0) + 1  # that `up` is gone
    rank = plan.ranks[0]
    marks = {
        wire.TANDEM_DEPLOYMENT: deployment.name,
        wire.TANDEM_RANK: str(rank.rank),
        wire.TANDEM_LAUNCH: state.launch_id or "",
    }
    left = subprocess.Popen(["sleep", "60"], env=marks, start_new_session=True)
    try:
        record_rank(state, rank, log=str(tmp_path / "rank0.log"), pid=left.pid)
        state.save()
        events: list[str] = []
        lifecycle.refuse_if_running(deployment, events.append)
        assert left.wait(timeout=40) is not None
        assert any("was killed before it became ready" in e for e in events), events
        assert "tiny-local" not in list_deployments()
    finally:
        left.kill()
