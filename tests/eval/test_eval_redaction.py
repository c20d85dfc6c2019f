"""A password in ``--url`` reaches the server and nothing else: not the terminal, not the log,
not the reports (``tandem.files`` writes them; the protocol keeps the URL without it)."""

from __future__ import annotations

from pathlib import Path

from gpqa_factory import make_rows, write_csv
from openai_stub import openai_stub

from tandem.cli import main

PASSWORD = "url-pass-0123456789"


def gpqa(csv: Path, url: str, out: Path, *more: str) -> int:
    return main(
        ["eval", "gpqa", "--csv", str(csv), "--url", url, "--out", str(out), "--no-progress", *more]
    )


def test_a_password_in_the_url_is_sent_and_never_shown_or_stored(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    csv = write_csv(tmp_path / "q.csv", make_rows(2))
    out = tmp_path / "o"
    with openai_stub() as stub:
        url = stub.url.replace("http://", f"http://user:{PASSWORD}@")
        first = gpqa(csv, url, out, "--limit", "1")
        printed = capsys.readouterr()
        resumed = gpqa(csv, url, out, "--resume")
        printed_again = capsys.readouterr()
    assert first == 0, printed.err
    assert resumed == 0, printed_again.err  # the logged protocol matches the URL as shown
    assert stub.authorizations and all(a.startswith("Basic ") for a in stub.authorizations)
    shown = printed.out + printed.err + printed_again.out + printed_again.err
    assert PASSWORD not in shown and "user:REDACTED@127.0.0.1" in printed.out
    written = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    assert {"responses.jsonl", "report.json", "report.md", "report.html"} <= set(written)
    for name, text in written.items():
        assert PASSWORD not in text, name
    assert "user:REDACTED@" in written["report.json"]
