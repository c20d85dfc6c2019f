"""The eval command line: public names, argument errors as messages."""

from __future__ import annotations

from pathlib import Path

from gpqa_factory import HEADER, make_rows, write_csv

import tandem.eval
from tandem.cli import ExitCode, main


def test_public_api() -> None:
    assert tandem.eval.__all__ == sorted(
        ["EvalReport", "GPQAConfig", "extract_answer", "rescore_log", "run_gpqa"]
    )


def test_url_and_deployment_are_exclusive(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    csv = write_csv(tmp_path / "q.csv", make_rows(1))
    code = main(
        [
            "eval",
            "gpqa",
            "--csv",
            str(csv),
            "dep",
            "--url",
            "http://x",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == ExitCode.USER_ERROR
    assert "either a DEPLOYMENT name or --url" in capsys.readouterr().err


def test_bad_csv_is_one_message_before_any_request(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    csv = write_csv(tmp_path / "q.csv", make_rows(2), [c for c in HEADER if c != "Subdomain"])
    code = main(
        [
            "eval",
            "gpqa",
            "--csv",
            str(csv),
            "--url",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == ExitCode.USER_ERROR
    assert "missing column: 'Subdomain'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_rescore_of_a_missing_log(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["eval", "rescore", str(tmp_path / "nope.jsonl")])
    assert code == ExitCode.USER_ERROR
    assert "cannot read the response log" in capsys.readouterr().err


def test_help_shows_examples() -> None:
    assert main(["eval", "gpqa", "--help"]) == ExitCode.SUCCESS
