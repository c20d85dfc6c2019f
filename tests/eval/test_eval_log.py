"""The response log: append, resume, refuse a log of another model or protocol, rescore."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tandem.errors import SpecError
from tandem.eval.log import (
    Protocol,
    ResponseLog,
    ResponseRecord,
    SampleRecord,
    SamplingParams,
    read_log,
    sample_key,
)
from tandem.eval.prompt import QUERY_TEMPLATE
from tandem.eval.runner import rescore_log


def make_protocol(**changes: object) -> Protocol:
    base = dict(
        endpoint="http://127.0.0.1:8300",
        model="tiny",
        dataset_sha256="ab" * 32,
        template=QUERY_TEMPLATE,
        sampling=SamplingParams(max_tokens=32),
        fallback_sampling=SamplingParams(max_tokens=8, chat_template_kwargs={}),
    )
    base.update(changes)
    return Protocol(**base)  # type: ignore[arg-type]


def make_record(
    protocol: Protocol,
    record_id: str,
    content: str,
    correct: str = "B",
    fallback: str | None = None,
) -> SampleRecord:
    prompt = f"question {record_id}"
    return SampleRecord(
        key=sample_key(
            protocol, prompt=prompt, permutation=[1, 0, 2, 3], record_id=record_id, repeat=0
        ),
        record_id=record_id,
        repeat=0,
        domain="Physics",
        subdomain="Optics",
        permutation=[1, 0, 2, 3],
        correct_letter=correct,
        prompt=prompt,
        response=ResponseRecord(
            raw_content=content, content=content, finish_reason="stop", completion_tokens=10
        ),
        fallback=None
        if fallback is None
        else ResponseRecord(raw_content=fallback, content=fallback),
        finished_at=1.0,
    )


def test_append_and_resume_keeps_done_samples(tmp_path: Path) -> None:
    path = tmp_path / "responses.jsonl"
    protocol = make_protocol()
    log = ResponseLog.open(path, protocol, "q.csv", resume=False, now=0.0)
    log.append(make_record(protocol, "r1", "ANSWER: B"))
    log.close()
    again = ResponseLog.open(path, protocol, "q.csv", resume=True, now=5.0)
    assert list(again.done) == [make_record(protocol, "r1", "").key]
    assert again.session == 1
    again.close()
    contents = read_log(path)
    assert [s.index for s in contents.sessions] == [0, 1]
    assert contents.sessions[1].resumed


def test_existing_log_needs_resume(tmp_path: Path) -> None:
    path = tmp_path / "responses.jsonl"
    ResponseLog.open(path, make_protocol(), "q.csv", resume=False, now=0.0).close()
    with pytest.raises(SpecError) as info:
        ResponseLog.open(path, make_protocol(), "q.csv", resume=False, now=0.0)
    assert "--resume" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": "other-model"}, "protocol.model"),
        ({"endpoint": "http://10.0.0.1:8000"}, "protocol.endpoint"),
        ({"dataset_sha256": "cd" * 32}, "protocol.dataset_sha256"),
        ({"seed": 7}, "protocol.seed"),
        ({"sampling": SamplingParams(max_tokens=64)}, "protocol.sampling.max_tokens"),
        (
            {"sampling": SamplingParams(max_tokens=32, temperature=0.6)},
            "protocol.sampling.temperature",
        ),
    ],
    ids=["model", "endpoint", "data set", "seed", "max tokens", "temperature"],
)
def test_resume_refuses_a_mismatched_log(tmp_path: Path, change: dict, field: str) -> None:
    path = tmp_path / "responses.jsonl"
    ResponseLog.open(path, make_protocol(), "q.csv", resume=False, now=0.0).close()
    before = path.read_bytes()
    with pytest.raises(SpecError) as info:
        ResponseLog.open(path, make_protocol(**change), "q.csv", resume=True, now=0.0)
    assert [p.field for p in info.value.problems] == [field]
    assert "another model or protocol" in info.value.message
    assert path.read_bytes() == before, "a refused resume must not touch the log"


def test_line_cut_by_a_crash_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "responses.jsonl"
    protocol = make_protocol()
    log = ResponseLog.open(path, protocol, "q.csv", resume=False, now=0.0)
    log.append(make_record(protocol, "r1", "ANSWER: B"))
    log.close()
    with path.open("ab") as handle:
        handle.write(b'{"kind": "sample", "key": "half')
    assert len(read_log(path).samples) == 1
    ResponseLog.open(path, protocol, "q.csv", resume=True, now=1.0).close()
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_foreign_file_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "responses.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(SpecError, match="line 1"):
        read_log(path)


def test_key_depends_on_what_is_asked() -> None:
    p = make_protocol()
    key = sample_key(p, prompt="x", permutation=[0, 1, 2, 3], record_id="r", repeat=0)
    assert key == sample_key(p, prompt="x", permutation=[0, 1, 2, 3], record_id="r", repeat=0)
    assert key != sample_key(p, prompt="x", permutation=[1, 0, 2, 3], record_id="r", repeat=0)
    assert key != sample_key(p, prompt="y", permutation=[0, 1, 2, 3], record_id="r", repeat=0)
    assert key != sample_key(p, prompt="x", permutation=[0, 1, 2, 3], record_id="r", repeat=1)
    assert key != sample_key(
        make_protocol(model="m2"), prompt="x", permutation=[0, 1, 2, 3], record_id="r", repeat=0
    )


def test_rescore_reextracts_from_saved_texts(tmp_path: Path) -> None:
    path = tmp_path / "responses.jsonl"
    protocol = make_protocol()
    log = ResponseLog.open(path, protocol, "q.csv", resume=False, now=0.0)
    log.append(make_record(protocol, "r1", "ANSWER: B"))  # strict, right
    log.append(make_record(protocol, "r2", "**Answer:** B"))  # marked, right
    log.append(make_record(protocol, "r3", "garbage", fallback="ANSWER: B"))  # via re-ask
    log.append(make_record(protocol, "r4", "Answer: Because"))  # unparsed
    log.close()
    report = rescore_log(path)
    assert report.n_questions == 4
    assert report.accuracy == 0.75
    assert report.strict.accuracy == 0.25
    assert report.rates.rules == {"fallback-strict": 1, "marked": 1, "none": 1, "strict": 1}
    assert report.rates.fallback == 0.25 and report.rates.unparsed == 0.25
    written = json.loads((tmp_path / "report.json").read_text())
    assert {"accuracy", "ci95_low", "ci95_high", "n_questions"} <= set(written)
    assert (tmp_path / "report.md").is_file() and (tmp_path / "report.html").is_file()
    assert "<details>" in (tmp_path / "report.html").read_text()


def test_a_gzipped_log_is_one_message_naming_its_line(tmp_path: Path, tandem_here) -> None:
    path = tmp_path / "responses.jsonl"
    protocol = make_protocol()
    log = ResponseLog.open(path, protocol, "q.csv", resume=False, now=0.0)
    log.append(make_record(protocol, "r1", "ANSWER: B"))
    log.close()
    path.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(SpecError, match="line 1: not UTF-8 text"):
        read_log(path)
    done = tandem_here("eval", "rescore", str(path))
    assert done.code == 2 and f"{path}: line 1: not UTF-8 text" in done.err, done.err


def test_every_question_reasked_is_not_a_zero_fallback(tmp_path: Path) -> None:
    path = tmp_path / "responses.jsonl"
    protocol = make_protocol()
    log = ResponseLog.open(path, protocol, "q.csv", resume=False, now=0.0)
    for rid in ("r1", "r2"):
        log.append(make_record(protocol, rid, "thinking...", fallback="still thinking"))
    log.close()
    report = rescore_log(path)
    assert report.rates.reasked == 1.0 and report.rates.fallback == 0.0
    text = (tmp_path / "report.md").read_text()
    assert "re-asked 100.0% (answered by the re-ask 0.0%)" in text
