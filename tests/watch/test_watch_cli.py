"""The watch command line: durations, and ``watch report`` on a folder of samples."""

from __future__ import annotations

import gzip
import json

import click
import pytest

import tandem.watch
from tandem.cli import ExitCode, main
from tandem.cli.watch import Duration
from tandem.watch.folder import SampleLog, read_samples, write_run
from tandem.watch.sample import Verdict

from .test_summary import make_run, make_sample


@pytest.mark.parametrize(
    "text, seconds",
    [("5s", 5), ("5", 5), ("90m", 5400), ("3h", 10800), ("1h30m", 5400), ("0.5s", 0.5)],
)
def test_durations_read_as_people_write_them(text, seconds):
    assert Duration().convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["5x", "h", "1h 30m", "0s", "-5s"])
def test_a_bad_duration_says_how_to_write_one(text):
    with pytest.raises(click.BadParameter):
        Duration().convert(text, None, None)


def test_report_judges_a_folder_and_exits_1_on_a_failed_check(tmp_path, capsys):
    write_run(tmp_path, make_run())
    log = SampleLog(tmp_path)
    for i in range(6):
        log.append(make_sample(i, used_gib=116 + 0.1 * i, tokens=50.0 * i))
    log.close()
    with (tmp_path / "samples.jsonl").open("a") as handle:
        handle.write('{"schema_version": 1, "seq": 6, "segm')  # a watch killed mid-write
    read = read_samples(tmp_path)
    assert len(read.records) == 6 and read.torn and read.damaged == []
    SampleLog(tmp_path).close()  # a resumed watch cuts the torn line before appending
    assert (tmp_path / "samples.jsonl").read_text().endswith("}\n")

    assert (
        main(["watch", "report", str(tmp_path), "--json", "--max-memory-used-gib", "200"])
        == ExitCode.SUCCESS
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["passed"] and summary["samples"] == 6
    assert (
        main(["watch", "report", str(tmp_path), "--max-memory-used-gib", "100", "--no-plots"])
        == ExitCode.CHECK_FAILED
    )
    out = capsys.readouterr()
    assert "| memory used spark-101 | 116.50 GiB | 100 | **FAIL** |" in out.out
    assert "memory used spark-101" in out.err
    for name in ("memory.png", "gpu.png", "tokens.png", "load.png", "report.md", "summary.json"):
        assert (tmp_path / name).is_file()


def test_report_of_a_folder_without_a_watch_names_the_fix(tmp_path, capsys):
    assert main(["watch", "report", str(tmp_path)]) == ExitCode.USER_ERROR
    assert "no watch.json" in capsys.readouterr().err


def test_the_public_names_are_sorted():
    assert tandem.watch.__all__ == sorted(tandem.watch.__all__)


def _folder_with(tmp_path, samples: bytes):
    write_run(tmp_path, make_run())
    (tmp_path / "samples.jsonl").write_bytes(samples)
    return tmp_path


def test_a_binary_samples_file_is_one_message_naming_file_and_line(tmp_path, capsys):
    folder = _folder_with(tmp_path, gzip.compress(make_sample(0).model_dump_json().encode() * 50))
    assert main(["watch", "report", str(folder), "--no-plots"]) == ExitCode.USER_ERROR
    err = capsys.readouterr().err
    assert f"{folder / 'samples.jsonl'}: no line is a watch sample" in err
    assert "line 1: not UTF-8 text" in err and "fix:" in err


def test_an_empty_watch_fails_as_nothing_to_judge(tmp_path, capsys):
    folder = _folder_with(tmp_path, b"")
    assert main(["watch", "report", str(folder), "--no-plots"]) == ExitCode.CHECK_FAILED
    out = capsys.readouterr()
    assert "**FAIL**" in out.out and "samples judged" in out.err


def test_a_damaged_middle_line_is_counted_and_shown(tmp_path, capsys):
    good = [make_sample(i).model_dump_json().encode() + b"\n" for i in range(3)]
    folder = _folder_with(tmp_path, good[0] + b'{"seq": "torn by a disk"}\n' + good[1] + good[2])
    assert main(["watch", "report", str(folder), "--json", "--no-plots"]) == ExitCode.SUCCESS
    summary = json.loads(capsys.readouterr().out)
    assert summary["samples"] == 3 and summary["damaged_lines"] == [2]
    assert "1 damaged line(s) skipped (line 2)" in (folder / "report.md").read_text()


def test_every_sample_down_fails(tmp_path, capsys):
    samples = [make_sample(i) for i in range(3)]
    for s in samples:
        s.verdict = Verdict.DOWN
    folder = _folder_with(tmp_path, b"".join(s.model_dump_json().encode() + b"\n" for s in samples))
    assert main(["watch", "report", str(folder), "--no-plots"]) == ExitCode.CHECK_FAILED
    assert "down samples" in capsys.readouterr().err
    assert (
        main(["watch", "report", str(folder), "--no-plots", "--max-down-samples", "3"])
        == ExitCode.SUCCESS
    )
