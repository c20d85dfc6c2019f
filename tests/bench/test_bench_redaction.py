"""A password in ``--url`` reaches the server and nothing else: not the terminal, not
``summary.json``, ``requests.jsonl`` or ``report.md`` (all written through ``tandem.files``)."""

from __future__ import annotations

from openai_stub import openai_stub

from tandem.cli import main

PASSWORD = "url-pass-0123456789"


SMALL = ["--concurrency", "1", "--requests", "2", "--warmup", "0", "--output-tokens", "4"]
QUIET = ["--no-server-metrics", "--no-plots", "--quiet"]


def bench(url: str, out, prompts, *more: str) -> int:  # type: ignore[no-untyped-def]
    files = ["--out", str(out), "--prompt-file", str(prompts)]
    return main(["bench", "run", "--url", url, *files, *SMALL, *QUIET, *more])


def test_a_password_in_the_url_is_sent_and_never_shown_or_stored(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nwhat is up\n")
    out = tmp_path / "b"
    with openai_stub() as stub:
        url = stub.url.replace("http://", f"http://user:{PASSWORD}@")
        first = bench(url, out, prompts)
        printed = capsys.readouterr()
        resumed = bench(url, out, prompts, "--resume")
        printed_again = capsys.readouterr()
    assert first == 0, printed.err
    assert resumed == 0, printed_again.err  # the saved options match the URL as shown
    assert stub.authorizations and all(a.startswith("Basic ") for a in stub.authorizations)
    shown = printed.out + printed.err + printed_again.out + printed_again.err
    assert PASSWORD not in shown
    written = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    assert {"summary.json", "requests.jsonl", "report.md"} <= set(written)
    for name, text in written.items():
        assert PASSWORD not in text, name
    assert "user:REDACTED@127.0.0.1" in written["summary.json"]
    assert "user:REDACTED@127.0.0.1" in written["report.md"]
