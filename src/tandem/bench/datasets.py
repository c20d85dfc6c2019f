"""Prompts from a local file, every row checked before a request is sent.

Formats, by the file's extension:

- ``.json``: a JSON list of rows (ShareGPT's files are one:
  ``[{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}]}, ...]``).
- ``.jsonl``: one row per line.
- ``.csv``: one prompt per row, in the column ``column`` (default ``prompt``); the first line
  names the columns.
- anything else: one prompt per non-blank line, or JSONL when the first such line is a JSON
  object (the prompt files of earlier versions).

A row (a JSON object) is one of ``{"prompt": "..."}`` (a completion prompt),
``{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}]}`` (OpenAI chat;
content may be a list of text parts) or ``{"conversations": [{"from": "system" | "human" |
"gpt" | ..., "value": "..."}]}`` (ShareGPT); other keys are ignored. Only the system prompt and
the user turns are taken: the answers are the server's, generated as the run goes, and their
length is ``--output-tokens`` (with ``ignore_eos``), not the recorded answers'.

A row that cannot be sent is one ``SpecError`` naming the file, the row (the line of a JSONL or
CSV file, the entry of a JSON list) and the field, raised while loading, so before any request.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from tandem.bench.metrics import LatencyStats
from tandem.errors import SpecError
from tandem.jsonfiles import read_json, read_jsonl

Format = Literal["json", "jsonl", "csv", "text"]
DEFAULT_COLUMN = "prompt"
_HINT = (
    'rows are {"prompt": "..."}, {"messages": [{"role": "user", "content": "..."}]} or '
    'ShareGPT {"conversations": [{"from": "human", "value": "..."}]}'
)
_CHAT_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
}


@dataclass(frozen=True)
class DataRow:
    """One row: the user turns, in order, and the system prompt in front of them."""

    user_turns: tuple[str, ...]
    system: str | None = None


@dataclass(frozen=True)
class Dataset:
    file: str
    format: Format
    rows: list[DataRow]


class DatasetSummary(BaseModel):
    """What a run took from its prompt file."""

    model_config = ConfigDict(extra="forbid")

    file: str
    format: Format
    rows: int = Field(description="Rows in the file.")
    measured: int = Field(description="Rows whose length the server's tokenizer measured.")
    too_long: int = Field(
        description="Measured rows left out: with their answers they would not fit max_model_len."
    )
    sent: int = Field(description="Conversations the measured load points send from it.")
    distinct: int = Field(description="Different rows among them; fewer than sent: rows repeat.")
    prompt_tokens: LatencyStats = Field(
        default_factory=LatencyStats,
        description="Tokens of each conversation sent, by the server's tokenizer (its user "
        "turns and system prompt through the endpoint's template, answers empty): for one "
        "turn, the prompt tokens the server counts.",
    )


def load_dataset(path: str | Path, column: str | None = None) -> Dataset:
    """Every row of a prompt file, checked.

    Raises:
        SpecError: the file cannot be read, or a row or field of it cannot be sent (naming the
            row and the field), or it holds no prompt.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    fmt: Format
    if suffix == ".json":
        fmt, rows = "json", _json_rows(p)
    elif suffix == ".jsonl":
        fmt, rows = "jsonl", _jsonl_rows(p)
    elif suffix == ".csv":
        fmt, rows = "csv", _csv_rows(p, column or DEFAULT_COLUMN)
    else:
        lines = [line for line in _text(p).splitlines() if line.strip()]
        if lines and lines[0].lstrip().startswith("{"):
            fmt, rows = "jsonl", _jsonl_rows(p)
        else:
            fmt, rows = "text", [DataRow((line,)) for line in lines]
    if not rows:
        raise SpecError("the prompt file holds no prompt", file=str(p), field="prompt_file")
    return Dataset(str(p), fmt, rows)


def row_of(value: Any) -> DataRow:
    """The row a JSON value stands for.

    Raises:
        ValueError: it is not a row; the message starts with the field at fault.
    """
    if not isinstance(value, dict):
        raise ValueError("a row is a JSON object with `prompt`, `messages` or `conversations`")
    if "messages" in value:
        return _turns(value["messages"], "messages", ("role", "content"), _CHAT_ROLES)
    if "conversations" in value:
        return _turns(value["conversations"], "conversations", ("from", "value"), _SHAREGPT_ROLES)
    if "prompt" in value:
        return DataRow((_content(value["prompt"], "prompt"),))
    raise ValueError("no `prompt`, `messages` or `conversations` field")


def _turns(turns: Any, name: str, keys: tuple[str, str], roles: Mapping[str, str]) -> DataRow:
    role_key, text_key = keys
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{name}: not a list of turns")
    system: list[str] = []
    users: list[str] = []
    for i, turn in enumerate(turns):
        where = f"{name}.{i}"
        if not isinstance(turn, dict):
            raise ValueError(f"{where}: not an object with `{role_key}` and `{text_key}`")
        said = turn.get(role_key)
        role = roles.get(said) if isinstance(said, str) else None
        if role is None:
            raise ValueError(f"{where}.{role_key}: {said!r} is not one of {', '.join(roles)}")
        if role == "assistant":  # the server answers for itself
            continue
        text = _content(turn.get(text_key), f"{where}.{text_key}")
        (system if role == "system" else users).append(text)
    if not users:
        raise ValueError(f"{name}: no user turn")
    return DataRow(tuple(users), "\n\n".join(system) or None)


def _content(value: Any, where: str) -> str:
    """A message's text: a string, or OpenAI's list of text parts (joined by newlines)."""
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise ValueError(f'{where}.{i}: only {{"type": "text"}} parts can be sent')
            texts.append(_content(part.get("text"), f"{where}.{i}.text"))
        value = "\n".join(texts)
    if not isinstance(value, str):
        raise ValueError(f"{where}: not a string")
    if not value.strip():
        raise ValueError(f"{where}: empty")
    return value


class _JsonList(RootModel[list[Any]]):
    """A JSON list; its entries are checked one by one (``row_of``), to name the row."""


def _json_rows(path: Path) -> list[DataRow]:
    entries = read_json(path, _JsonList, what="JSON list of prompt rows", hint=_HINT).root
    rows = []
    for number, value in enumerate(entries, 1):
        try:
            rows.append(row_of(value))
        except ValueError as exc:
            raise SpecError(f"row {number}: {exc}", file=str(path), hint=_HINT) from None
    return rows


def _jsonl_rows(path: Path) -> list[DataRow]:
    return read_jsonl(
        path,
        row_of,
        what="prompt row",
        kind="prompt file",
        hint=_HINT,
        strict=True,
        torn_last_line=False,
    ).records


def _csv_rows(path: Path, column: str) -> list[DataRow]:
    reader = csv.reader(io.StringIO(_text(path), newline=""))
    try:
        header = [name.strip() for name in next(reader, [])]
        if column not in header:
            raise SpecError(
                f"line 1 (the header) has no column '{column}'",
                file=str(path),
                field="prompt_column",
                hint=f"the columns are {', '.join(header) or 'none'}: name the one holding the "
                "prompts with --prompt-column",
            )
        at = header.index(column)
        rows = []
        for cells in reader:
            if not any(cell.strip() for cell in cells):
                continue
            line = reader.line_num
            if at >= len(cells):
                raise SpecError(
                    f"line {line}: no '{column}' cell ({len(cells)} of {len(header)} columns)",
                    file=str(path),
                )
            if not cells[at].strip():
                raise SpecError(f"line {line}: '{column}' is empty", file=str(path))
            rows.append(DataRow((cells[at],)))
    except csv.Error as exc:
        raise SpecError(f"line {reader.line_num}: not CSV: {exc}", file=str(path)) from None
    return rows


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(
            f"cannot read the prompt file: {exc.strerror or exc}",
            file=str(path),
            field="prompt_file",
        ) from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecError(
            f"line {line}: not UTF-8 text (a compressed or binary file?)",
            file=str(path),
            field="prompt_file",
            hint="save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
        ) from None
