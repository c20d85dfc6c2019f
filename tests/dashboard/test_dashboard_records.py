"""What a status carries of a deployment's own records: the evidence of each revision, and
events.log's newest lines."""

from __future__ import annotations

from factories import launched_local_state

from tandem.operations import evidence
from tandem.operations.overview import identity_of, read_events


def test_a_run_is_evidence_of_the_revision_that_ran_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    state = launched_local_state(tmp_path)
    state.revision = 2
    state.save()
    (tmp_path / "b1").mkdir()
    written = evidence.record(
        state.name, "bench", tmp_path / "b1", summary="c4: 40.0 tok/s", report="report.html"
    )
    assert written == [state.directory.path / evidence.EVIDENCE_FILE]
    state.revision = 3
    state.save()
    evidence.record(state.name, "smoke", tmp_path / "s1", summary="determinism pass", passed=True)
    assert set(evidence.latest(state.name, 2)) == {"bench"}
    now = evidence.latest(state.name, 3)
    assert set(now) == {"smoke"} and now["smoke"].passed is True
    assert evidence.latest(state.name, 2)["bench"].report == str(tmp_path / "b1" / "report.html")
    assert evidence.record("not-running", "eval", tmp_path) == []
    with (state.directory.path / evidence.EVIDENCE_FILE).open("a") as handle:
        handle.write("{not json\n")  # a torn line is skipped, not fatal
    assert set(evidence.latest(state.name, 3)) == {"smoke"}
    assert identity_of(state).revision == 3  # no revision record: the number alone


def test_events_are_the_newest_lines_with_the_restarts_counted(tmp_path):
    log = tmp_path / "events.log"
    lines = [f"2026-12-01T08:{m:02d}:00Z  restart {m}/9 in 1 s: ..." for m in range(50)]
    log.write_text("\n".join(["no stamp", *lines]) + "\n")
    events, restarts = read_events(log, last=5)
    assert restarts == 50 and len(events) == 5 and events[-1].text.startswith("restart 49/9")
    assert read_events(tmp_path / "none.log") == ([], 0)
