"""GPQA questions from the official CSV, checked, checksummed, and laid out as samples.

The real GPQA data set is gated: tandem never downloads or ships it. A user passes the CSV they
were granted (``gpqa_diamond.csv``); tests write their own file with the same columns.

Only these official columns are read (any others, and their order, are ignored):
``Record ID``, ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``, ``High-level domain``,
``Subdomain``. Option text is ``strip()``-ed and otherwise never rewritten (lm-eval once destroyed
bracketed maths with a "preprocess" regex).

The option order of a sample is a pure function of ``(record id, repeat, seed)``: each of the four
options gets the key ``sha256(f"{seed}|{record_id}|{repeat}|{option}")`` and options are sorted by
it. No global RNG, no dependence on what was asked before, so ``--limit``, ``--resume`` and
``rescore`` see the same order every time, and each repeat of a question sees a new order.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

from tandem.errors import ProblemList, SpecError

LETTERS = "ABCD"

COLUMN_RECORD_ID = "Record ID"
COLUMN_QUESTION = "Question"
COLUMN_CORRECT = "Correct Answer"
COLUMNS_INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
COLUMN_DOMAIN = "High-level domain"
COLUMN_SUBDOMAIN = "Subdomain"
REQUIRED_COLUMNS = (
    COLUMN_RECORD_ID,
    COLUMN_QUESTION,
    COLUMN_CORRECT,
    *COLUMNS_INCORRECT,
    COLUMN_DOMAIN,
    COLUMN_SUBDOMAIN,
)
TEXT_COLUMNS = (COLUMN_QUESTION, COLUMN_CORRECT, *COLUMNS_INCORRECT)
NOT_EMPTY = {
    COLUMN_RECORD_ID: "give every question a unique Record ID",
    **dict.fromkeys(TEXT_COLUMNS, "every question needs its text and all four options"),
}
"""The cells a row must fill, each with the fix an empty one names."""


@dataclass(frozen=True)
class Question:
    """One GPQA record: the correct option is ``options[0]``, as in the CSV."""

    record_id: str
    question: str
    options: tuple[str, str, str, str]
    domain: str
    subdomain: str


@dataclass(frozen=True)
class Dataset:
    """The questions of one CSV file, in file order, with the file's SHA-256."""

    path: str
    sha256: str
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class Sample:
    """One question asked once: its repeat index and the option order shown.

    ``permutation[k]`` is the index into ``Question.options`` shown at letter ``LETTERS[k]``.
    """

    question: Question
    repeat: int
    permutation: tuple[int, int, int, int]

    @property
    def shown_options(self) -> tuple[str, str, str, str]:
        o = self.question.options
        return tuple(o[i] for i in self.permutation)  # type: ignore[return-value]

    @property
    def correct_letter(self) -> str:
        return LETTERS[self.permutation.index(0)]


def load_gpqa_csv(path: str | Path) -> Dataset:
    """Read and check a GPQA-format CSV.

    Usage:
        data = load_gpqa_csv("gpqa_diamond.csv")
        print(len(data.questions), data.sha256)

    Raises:
        SpecError: the file is missing or unreadable, a column is missing, a record id is empty or
            repeated, or a question or option is empty. Every problem found is listed, each with
            its row (as a spreadsheet shows it, header = row 1) and column.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(
            f"cannot read the GPQA CSV: {exc.strerror or exc}",
            file=str(path),
            hint="pass the path of the GPQA CSV you were granted with --csv",
        ) from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(
            "the GPQA CSV is not UTF-8 text", file=str(path), hint="save the file as UTF-8 CSV"
        ) from exc
    reader = csv.DictReader(text.splitlines(keepends=True))
    header = [name.strip() for name in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise SpecError(
            f"missing column{'s' if len(missing) > 1 else ''}: {', '.join(map(repr, missing))}",
            file=str(path),
            field="header",
            hint="use the official GPQA CSV header (Record ID, Question, Correct Answer, "
            "Incorrect Answer 1..3, High-level domain, Subdomain)",
        )
    reader.fieldnames = header
    problems = ProblemList()
    seen: dict[str, int] = {}
    questions: list[Question] = []
    for row_number, row in enumerate(reader, start=2):
        cell = {column: (row.get(column) or "").strip() for column in REQUIRED_COLUMNS}
        record_id = cell[COLUMN_RECORD_ID]
        if record_id in seen:
            problems.add(
                f"row {row_number}, column '{COLUMN_RECORD_ID}'",
                f"duplicate id {record_id!r} (first on row {seen[record_id]})",
                "remove the repeated row or give it its own id",
            )
        elif record_id:
            seen[record_id] = row_number
        for column, fix in NOT_EMPTY.items():
            if not cell[column]:
                problems.add(f"row {row_number}, column '{column}'", "is empty", fix)
        texts = [cell[c] for c in (COLUMN_CORRECT, *COLUMNS_INCORRECT)]
        if all(texts) and len(set(texts)) < 4:
            problems.add(
                f"row {row_number}",
                "two options have the same text",
                "the four options must differ, or the correct letter is ambiguous",
            )
        questions.append(
            Question(
                record_id=record_id,
                question=cell[COLUMN_QUESTION],
                options=tuple(texts),  # type: ignore[arg-type]
                domain=cell[COLUMN_DOMAIN] or "unknown",
                subdomain=cell[COLUMN_SUBDOMAIN] or "unknown",
            )
        )
    if not questions:
        problems.add("rows", "the file has a header but no questions")
    if problems:
        raise SpecError(
            f"{len(problems.items)} problem(s) in the GPQA CSV",
            file=str(path),
            problems=problems.items,
        )
    return Dataset(
        path=str(path), sha256=hashlib.sha256(raw).hexdigest(), questions=tuple(questions)
    )


def permutation(record_id: str, repeat: int, seed: int) -> tuple[int, int, int, int]:
    """The option order for one sample: a pure function of (record id, repeat, seed).

    Returns a tuple ``p`` where letter ``LETTERS[k]`` shows option ``p[k]`` (0 = correct).
    """

    def key(option: int) -> bytes:
        return hashlib.sha256(f"{seed}|{record_id}|{repeat}|{option}".encode()).digest()

    return tuple(sorted(range(4), key=key))  # type: ignore[return-value]


def make_samples(
    dataset: Dataset, *, repeats: int = 1, seed: int = 0, limit: int | None = None
) -> list[Sample]:
    """Samples to ask: the first ``limit`` questions (file order), each ``repeats`` times.

    Ordered repeat-major (every question once, then every question again), so an interrupted
    run has covered as many distinct questions as possible.
    """
    questions = dataset.questions[:limit] if limit is not None else dataset.questions
    return [
        Sample(q, r, permutation(q.record_id, r, seed)) for r in range(repeats) for q in questions
    ]
