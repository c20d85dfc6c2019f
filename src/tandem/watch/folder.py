"""A watch folder on disk: ``watch.json`` and ``samples.jsonl``, appended and read back.

A killed watch may leave half a line at the end of ``samples.jsonl``; ``read_samples`` skips
it and ``SampleLog`` cuts it off before appending, so a resumed watch continues a clean file.
"""

from __future__ import annotations

import json
from pathlib import Path

from tandem.errors import StateError
from tandem.watch.sample import RUN_FILE, SAMPLES_FILE, Sample, WatchRun


def read_run(folder: Path) -> WatchRun | None:
    """The folder's ``watch.json``; None when the folder holds no watch."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return WatchRun.model_validate_json(path.read_text())
    except ValueError as exc:
        raise StateError(
            f"unreadable watch file: {exc}", file=str(path), hint="point --out at a new folder"
        ) from exc


def write_run(folder: Path, run: WatchRun) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RUN_FILE).write_text(run.model_dump_json(indent=2) + "\n")


def read_samples(folder: Path) -> list[Sample]:
    """Every complete sample of the folder, in order (a torn last line is skipped)."""
    path = Path(folder) / SAMPLES_FILE
    if not path.is_file():
        return []
    samples = []
    for line in path.read_text().splitlines():
        try:
            samples.append(Sample.model_validate(json.loads(line)))
        except ValueError:
            continue
    return samples


class SampleLog:
    """Appends samples to ``samples.jsonl``, one flushed line each."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / SAMPLES_FILE
        self._cut_torn_tail()
        self.handle = self.path.open("a")

    def _cut_torn_tail(self) -> None:
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def append(self, sample: Sample) -> None:
        self.handle.write(sample.model_dump_json() + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()
