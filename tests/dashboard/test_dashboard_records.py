"""What a status carries of a deployment's own records: the evidence of each revision, and
events.log's newest lines."""

from __future__ import annotations

from datetime import UTC, datetime

from factories import launched_local_state

from tandem.backends.state import load_state
from tandem.operations import evidence
from tandem.operations.overview import identity_of, read_events
from tandem.watch.events import EventReader


def test_a_run_is_evidence_of_the_revision_that_ran_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    name = launched_local_state(tmp_path).name
    state = load_state(name)
    state.revision = 2
    state.save()
    written = evidence.record(
        name, "bench", tmp_path / "b1", summary="c4: 40.0 tok/s", report="report.html"
    )
    assert written == state.directory.path / evidence.EVIDENCE_FILE
    state.revision = 3
    state.save()
    group = load_state(name).group(0)
    group.revision = 3
    group.save()
    evidence.record(name, "smoke", tmp_path / "s1", group=0, summary="ok", passed=True)
    evidence.record(name, "eval", tmp_path / "e1", summary="through the front door")
    assert set(evidence.latest(name, 2)) == {"bench"}
    now = evidence.latest(name, 3, group=0)
    assert set(now) == {"smoke", "eval"} and now["smoke"].passed is True
    assert now["smoke"].group == 0 and now["eval"].group is None  # the whole deployment's
    assert evidence.latest(name, 2)["bench"].report == str(tmp_path / "b1" / "report.html")
    assert evidence.record("not-running", "eval", tmp_path) is None
    with (state.directory.path / evidence.EVIDENCE_FILE).open("a") as handle:
        handle.write("{not json\n")  # a torn line is skipped, not fatal
    assert set(evidence.latest(name, 3, group=0)) == {"smoke", "eval"}
    current = load_state(name)
    assert identity_of(current, current.group(0)).revision == 3  # no record: the number alone


def test_events_are_the_newest_lines_with_the_restarts_counted(tmp_path):
    log = tmp_path / "events.log"
    lines = [f"2026-12-01T08:{m:02d}:00Z  restart {m}/9 in 1 s: ..." for m in range(50)]
    log.write_text("\n".join(["no stamp", *lines]) + "\n")
    events, restarts = read_events(log, last=5)
    assert restarts == 50 and len(events) == 5 and events[-1].text.startswith("restart 49/9")
    assert read_events(tmp_path / "none.log") == ([], 0)
    log.write_text(
        "2026-12-01T08:00:00Z  group 1: restart 1/3 in 1 s: ...\n"
        "2026-12-01T08:00:01Z  group 0: out of the router's rotation: http://a\n"
        "2026-12-01T08:00:02Z  `tandem down` stops the supervisor\n"
    )
    one, restarts = read_events(log, group=1)
    assert [e.text for e in one] == ["restart 1/3 in 1 s: ..."] and restarts == 1
    assert [e.text for e in read_events(log, group=0)[0]] == [
        "out of the router's rotation: http://a"
    ]


def test_a_groups_line_reads_the_same_in_a_status_and_in_a_watch(tmp_path):
    """``read_events`` (status, dashboard) and ``EventReader`` (watch) read a group's lines by
    one rule: with two spaces after the prefix they once disagreed (`` restart …``, no restart
    counted, against ``restart …``)."""
    log = tmp_path / "events.log"
    log.write_text(
        "2026-12-01T08:00:00Z  group 1:  restart 1/3 in 1 s: ...\n"
        "2026-12-01T08:00:01Z  group 10: restart 1/3 in 1 s: ...\n"
    )
    status, restarts = read_events(log, group=1)
    since = datetime(2026, 12, 1, tzinfo=UTC)
    watched, counted = EventReader("x", since=since, path=log, group=1).read()
    assert [e.text for e in status] == [e.text for e in watched] == ["restart 1/3 in 1 s: ..."]
    assert restarts == counted == 1 and status[0].restart
