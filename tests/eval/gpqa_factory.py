"""GPQA-format CSVs written by the tests (the real data set is gated and never used here)."""

from __future__ import annotations

import csv
from pathlib import Path

HEADER = [
    "Pre-Revision Question",
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Subdomain",
    "Record ID",
    "High-level domain",
]

DOMAINS = [
    ("Physics", "Quantum Mechanics"),
    ("Chemistry", "Organic Chemistry"),
    ("Biology", "Genetics"),
    ("Physics", "Electromagnetism"),
]


def make_rows(n: int) -> list[dict[str, str]]:
    rows = []
    for i in range(n):
        domain, subdomain = DOMAINS[i % len(DOMAINS)]
        rows.append(
            {
                "Pre-Revision Question": "",
                "Question": f"Question number {i}: pick {i}.",
                "Correct Answer": f"right {i}",
                "Incorrect Answer 1": f"wrong {i}a",
                "Incorrect Answer 2": f"wrong {i}b\n",
                "Incorrect Answer 3": f"wrong {i}c",
                "Subdomain": subdomain,
                "Record ID": f"rec{i:03d}",
                "High-level domain": domain,
            }
        )
    return rows


def write_csv(path: Path, rows: list[dict[str, str]], header: list[str] | None = None) -> Path:
    header = header or HEADER
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path
