"""The GPQA harness against the real vLLM engine serving the tiny random-weight model.

Random weights write garbage and practically never stop, so with a small ``max_tokens`` every
response is truncated and the thinking-off re-ask runs: these tests check the harness's
bookkeeping (log, resume, report), not accuracy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpqa_factory import make_rows, write_csv

pytestmark = pytest.mark.engine

N_QUESTIONS = 6
ARGS = ["--max-tokens", "24", "--fallback-max-tokens", "8", "--concurrency", "2", "--no-progress"]
TIMING_FIELDS = {"timing", "latency_s"}


def tandem(*args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from tandem.cli import main; sys.exit(main())",
        *args,
    ]


def gpqa_args(csv: Path, endpoint, out: Path) -> list[str]:  # type: ignore[no-untyped-def]
    key = ["--api-key", endpoint.api_key] if endpoint.api_key else []
    return [
        "eval",
        "gpqa",
        "--csv",
        str(csv),
        "--url",
        endpoint.url,
        "--model",
        endpoint.model,
        "--out",
        str(out),
        *key,
        *ARGS,
    ]


def samples_in(log: Path) -> list[dict]:
    if not log.exists():
        return []
    lines = log.read_bytes().split(b"\n")[:-1]
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r["kind"] == "sample"]


def without_timings(value):  # type: ignore[no-untyped-def]
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_FIELDS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def test_harness_writes_log_and_report(tiny_endpoint, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    csv = write_csv(tmp_path / "gpqa.csv", make_rows(3))
    out = tmp_path / "run"
    done = subprocess.run(
        tandem(*gpqa_args(csv, tiny_endpoint, out)), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    samples = samples_in(out / "responses.jsonl")
    assert len(samples) == 3
    for sample in samples:
        assert sample["response"]["finish_reason"] == "length"
        assert sample["response"]["completion_tokens"] == 24
        assert sample["fallback"] is not None, "an unparsed answer gets the re-ask"
        assert sample["fallback"]["completion_tokens"] <= 8
    report = json.loads((out / "report.json").read_text())
    assert report["n_questions"] == 3 and report["n_samples"] == 3
    assert 0 <= report["ci95_low"] <= report["accuracy"] <= report["ci95_high"] <= 1
    assert report["rates"]["truncated"] == 1.0
    assert report["rates"]["reasked"] == 1.0  # every question was asked again: said so
    assert report["model"] == tiny_endpoint.model
    assert {d["name"] for d in report["by_domain"]} == {"Physics", "Chemistry", "Biology"}
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert "accuracy" in done.stdout

    rescored = subprocess.run(
        tandem(
            "eval", "rescore", str(out / "responses.jsonl"), "--out", str(tmp_path / "rescored")
        ),
        capture_output=True,
        text=True,
    )
    assert rescored.returncode == 0, rescored.stderr
    again = json.loads((tmp_path / "rescored" / "report.json").read_text())
    assert without_timings(again) == without_timings(report)


def test_killed_run_resumes_to_the_same_report(tiny_endpoint, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    csv = write_csv(tmp_path / "gpqa.csv", make_rows(N_QUESTIONS))

    whole = tmp_path / "whole"
    done = subprocess.run(
        tandem(*gpqa_args(csv, tiny_endpoint, whole)), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr

    broken = tmp_path / "broken"
    log = broken / "responses.jsonl"
    proc = subprocess.Popen(
        tandem(*gpqa_args(csv, tiny_endpoint, broken)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(samples_in(log)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    before_kill = samples_in(log)
    assert proc.returncode == -signal.SIGKILL
    assert 2 <= len(before_kill) < N_QUESTIONS, "killed mid-run"

    refused = subprocess.run(
        tandem(*gpqa_args(csv, tiny_endpoint, broken)), capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "--resume" in refused.stderr

    resumed = subprocess.run(
        tandem(*gpqa_args(csv, tiny_endpoint, broken), "--resume"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr

    after = samples_in(log)
    keys = [s["key"] for s in after]
    assert len(keys) == len(set(keys)) == N_QUESTIONS, "no question asked twice"
    assert after[: len(before_kill)] == before_kill, "logged answers are kept, not re-asked"
    assert {s["session"] for s in after[len(before_kill) :]} == {1}

    report = json.loads((broken / "report.json").read_text())
    reference = json.loads((whole / "report.json").read_text())
    assert report["timing"]["sessions"] == 2
    assert without_timings(report) == without_timings(reference)
