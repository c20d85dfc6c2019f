"""The one reader of saved JSON and JSONL files: every fault is one message naming the file and
the line; damaged lines between records are counted, a torn last line is skipped."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from pydantic import BaseModel

from tandem.errors import SpecError, StateError
from tandem.jsonfiles import read_json, read_jsonl


class Point(BaseModel):
    x: int


def read(path: Path, **options):
    return read_jsonl(path, Point.model_validate, what="point", hint="give points", **options)


def test_records_damaged_lines_and_a_torn_tail(tmp_path: Path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"x": 1}\n\n{"x": "one"}\n\xff\xfe\n[1]\n{"x": 2}\n{"x": 3')
    got = read(path)
    assert [p.x for p in got.records] == [1, 2]
    assert got.damaged == [3, 4, 5] and got.torn
    assert got.skipped_note == (
        "3 damaged line(s) skipped (line 3, 4, 5); a torn last line skipped (a writer killed "
        "mid-line)"
    )


@pytest.mark.parametrize(
    "data, fault",
    [
        (gzip.compress(b'{"x": 1}\n' * 20), "not UTF-8 text"),
        (b"\x00\x01\x02\n", "not JSON"),
        (b'{"y": 1}\n', "not a point: x: Field required"),
    ],
    ids=["gzip", "binary", "other records"],
)
def test_a_file_without_a_record_is_one_message(tmp_path: Path, data: bytes, fault: str):
    path = tmp_path / "p.jsonl"
    path.write_bytes(data)
    with pytest.raises(StateError) as caught:
        read(path, error=StateError)
    assert caught.value.file == str(path) and "line 1: " + fault in caught.value.message
    assert caught.value.hint == "give points"


def test_strict_refuses_the_first_damaged_line(tmp_path: Path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"x": 1}\n{"x": 2\n{"x": 3}\n')
    with pytest.raises(SpecError, match="line 2: not JSON"):
        read(path, strict=True)


def test_missing_and_folder_are_messages(tmp_path: Path):
    for path in (tmp_path / "none.jsonl", tmp_path):
        with pytest.raises(SpecError, match="cannot read the point file"):
            read(path)


@pytest.mark.parametrize(
    "data, fault",
    [
        (b'{\n  "x": 1,\n}', "line 3: not JSON"),
        (b'{\n"x": 1}\xff', "line 2: not UTF-8 text"),
        (b'{"x": "a"}', "not a point: x: Input should be a valid integer"),
    ],
)
def test_a_json_file_names_the_line_or_the_field(tmp_path: Path, data: bytes, fault: str):
    path = tmp_path / "p.json"
    path.write_bytes(data)
    with pytest.raises(SpecError) as caught:
        read_json(path, Point, what="point", hint="give a point")
    assert caught.value.file == str(path) and fault in caught.value.message
