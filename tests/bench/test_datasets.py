"""Prompt files: every format read into conversations, every bad row one message naming the
file, the row and the field, before anything is sent."""

from __future__ import annotations

import gzip

import pytest

from tandem.bench.config import BenchConfig
from tandem.bench.datasets import DataRow, load_dataset
from tandem.bench.load_generator import run
from tandem.errors import SpecError

from .conftest import FIXTURES

DATASETS = FIXTURES / "datasets"


def test_sharegpt_json_keeps_system_and_user_turns_in_order():
    data = load_dataset(DATASETS / "sharegpt.json")
    assert data.format == "json"
    assert data.rows == [
        DataRow(("Name three rivers of Europe.",)),
        DataRow(("Why is the sky blue?", "And sunsets red?"), "You answer in one sentence."),
        DataRow(("Write a haiku about a harbor at dawn.",)),  # the answer before it is dropped
        DataRow(("What does a compiler do?", "And a linker?", "And a loader?")),
    ]


def test_jsonl_mixes_chat_messages_prompts_and_sharegpt_rows():
    """Text parts are joined, a blank line skipped, and a last line without its newline is a
    row (a person's file, not a writer killed mid-line)."""
    data = load_dataset(DATASETS / "chat.jsonl")
    assert data.format == "jsonl"
    assert data.rows == [
        DataRow(("List two prime numbers.",), "Be brief."),
        DataRow(("The capital of France is",)),
        DataRow(("Describe a meadow\nin spring.", "And in autumn?")),
        DataRow(("Count from one to five.",)),
    ]


def test_csv_reads_its_column_with_quoted_commas_and_line_breaks():
    data = load_dataset(DATASETS / "prompts.csv")
    assert data.format == "csv"
    assert [r.user_turns[0] for r in data.rows] == [
        "Explain what a tensor is.",
        "Summarize: the model, the node and the rank.",
        "Two lines:\none and two",
    ]
    assert [r.user_turns for r in load_dataset(DATASETS / "prompts.csv", "source").rows] == [
        ("manual",)
    ] * 3


def test_plain_text_and_old_jsonl_prompt_files_still_read(tmp_path):
    assert load_dataset(DATASETS / "prompts.txt").rows == [
        DataRow(("Tell me about lanterns.",)),
        DataRow(("What is a canyon?",)),
    ]
    old = tmp_path / "p.txt"
    old.write_text('{"prompt": "a b"}\n\n{"prompt": "c"}\n')
    assert load_dataset(old).format == "jsonl"
    assert [r.user_turns for r in load_dataset(old).rows] == [("a b",), ("c",)]


BAD = {
    "json: not a list": ("d.json", '{"conversations": []}', "not a JSON list of prompt rows"),
    "json: not JSON": ("d.json", '[\n{"prompt": "a"},\n{"prompt": }\n]', "line 3: not JSON"),
    "json: a value is not text": (
        "d.json",
        '[{"prompt": "ok"}, {"conversations": [{"from": "human", "value": 7}]}]',
        "row 2: conversations.0.value: not a string",
    ),
    "json: an unknown speaker": (
        "d.json",
        '[{"conversations": [{"from": "robot", "value": "hi"}]}]',
        "row 1: conversations.0.from: 'robot' is not one of system, human, user, gpt",
    ),
    "json: no user turn": (
        "d.json",
        '[{"conversations": [{"from": "gpt", "value": "hi"}]}]',
        "row 1: conversations: no user turn",
    ),
    "json: a row that is no object": ("d.json", '["just text"]', "row 1: a row is a JSON object"),
    "jsonl: an empty message": (
        "d.jsonl",
        '{"prompt": "ok"}\n{"messages": [{"role": "user", "content": "  "}]}\n',
        "line 2: not a prompt row: messages.0.content: empty",
    ),
    "jsonl: an image part": (
        "d.jsonl",
        '{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}\n',
        'line 1: not a prompt row: messages.0.content.0: only {"type": "text"} parts',
    ),
    "jsonl: a tool message": (
        "d.jsonl",
        '{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}\n',
        "line 1: not a prompt row: messages.1.role: 'tool' is not one of system, user",
    ),
    "jsonl: no prompt field": (
        "d.jsonl",
        '{"text": "x"}\n',
        "line 1: not a prompt row: no `prompt`, `messages` or `conversations` field",
    ),
    "jsonl: not JSON": ("d.jsonl", '{"prompt": "a"}\n{"prompt": \n', "line 2: not JSON"),
    "csv: no such column": ("d.csv", "id,text\n1,hello\n", "line 1 (the header) has no column"),
    "csv: an empty cell": ("d.csv", "id,prompt\n1,hello\n2,\n", "line 3: 'prompt' is empty"),
    "csv: a short row": ("d.csv", "id,prompt\n1,hello\n2\n", "line 3: no 'prompt' cell"),
    "text: nothing": ("d.txt", "\n  \n", "holds no prompt"),
}


@pytest.mark.parametrize(("name", "text", "said"), BAD.values(), ids=BAD.keys())
def test_a_bad_prompt_file_is_one_message_naming_file_row_and_field(tmp_path, name, text, said):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_dataset(path)
    assert info.value.file == str(path)
    assert said in info.value.message, info.value.message


@pytest.mark.parametrize("name", ["d.json", "d.jsonl", "d.csv", "d.txt"])
def test_a_compressed_prompt_file_names_its_line(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(gzip.compress(b'{"prompt": "x"}\n' * 20))
    with pytest.raises(SpecError) as info:
        load_dataset(path)
    assert info.value.file == str(path)
    assert "not UTF-8" in info.value.message and "line" in info.value.message


def test_a_missing_csv_column_names_the_columns_and_the_option(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("id,text\n1,hello\n")
    with pytest.raises(SpecError) as info:
        load_dataset(path)
    assert info.value.field == "prompt_column" and "id, text" in (info.value.hint or "")
    assert load_dataset(path, "text").rows == [DataRow(("hello",))]


def test_a_bad_row_stops_the_run_before_the_server_is_asked(tmp_path):
    """Nothing listens at the URL: the file's message comes first, not a connection error."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "ok"}\n{"messages": []}\n')
    config = BenchConfig(url="http://127.0.0.1:9", prompt_file=str(path), idle_check_s=0)
    with pytest.raises(SpecError, match="line 2: not a prompt row: messages: not a list"):
        run(config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_cli_says_a_bad_row_in_one_message(tmp_path, tandem_here):
    path = tmp_path / "d.json"
    path.write_text('[{"conversations": [{"from": "human", "value": ""}]}]')
    done = tandem_here(
        "bench", "--url", "http://127.0.0.1:9", "--prompt-file", str(path), "--quiet"
    )
    assert done.code == 2 and "Traceback" not in done.err
    assert f"{path}: row 1: conversations.0.value: empty" in done.err
