"""A watch folder is the user's to share: what it copies from ``events.log`` and the state goes
through ``tandem.files``, so a secret quoted there is ``REDACTED`` in ``samples.jsonl`` and
``watch.json``, and every line still parses."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from tandem.watch.events import EventReader
from tandem.watch.folder import SampleLog, write_run

from .test_summary import make_run, make_sample

TOKEN = "hf_abcdefghijklmnopqrstuvwx"
PASSWORD = "url-pass-0123456789"


def test_events_copied_into_samples_lose_their_secrets(tmp_path):
    events = tmp_path / "events.log"
    events.write_text(  # as an older tandem wrote it, or a rank's error quoted it
        f"2026-12-01T08:10:00Z  restart 1/3 in 10 s: rank 1 said 'env HF_TOKEN={TOKEN}'\n"
        f"2026-12-01T08:11:00Z  restart 1 done: http://user:{PASSWORD}@h:8000 answers\n"
    )
    new, _ = EventReader("x", since=datetime(2026, 12, 1, tzinfo=UTC), path=events).read()
    assert len(new) == 2
    out = tmp_path / "watch"
    write_run(out, make_run().model_copy(update={"endpoint": f"http://user:{PASSWORD}@h:8000"}))
    log = SampleLog(out)
    log.append(make_sample(0, events=new))
    log.close()

    samples = (out / "samples.jsonl").read_text()
    run = (out / "watch.json").read_text()
    for text in (samples, run):
        assert TOKEN not in text and PASSWORD not in text
    texts = [e["text"] for e in json.loads(samples.splitlines()[0])["events"]]
    assert texts == [
        "restart 1/3 in 10 s: rank 1 said 'env HF_TOKEN=REDACTED'",
        "restart 1 done: http://user:REDACTED@h:8000 answers",
    ]
    assert json.loads(run)["endpoint"] == "http://user:REDACTED@h:8000"
