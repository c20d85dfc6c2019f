"""A watch folder on disk: ``watch.json`` and ``samples.jsonl``, appended and read back.

A killed watch may leave half a line at the end of ``samples.jsonl``; ``read_samples`` skips
it (and counts damaged lines, ``tandem.jsonfiles``) and ``SampleLog`` cuts it off before
appending, so a resumed watch continues a clean file.
Both files are written through ``tandem.files``: a sample carries ``events.log`` lines, which
may quote a secret, and the folder is the user's to share.
"""

from __future__ import annotations

from pathlib import Path

from tandem import files
from tandem.errors import StateError
from tandem.jsonfiles import JsonLines, read_json, read_jsonl
from tandem.watch.sample import RUN_FILE, SAMPLES_FILE, Sample, WatchRun

_HINT = "give the --out folder of a `tandem watch` as it wrote it, or watch into a new folder"


def read_run(folder: Path) -> WatchRun | None:
    """The folder's ``watch.json``; None when the folder holds no watch."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        return None
    return read_json(path, WatchRun, what="watch file", hint=_HINT, error=StateError)


def write_run(folder: Path, run: WatchRun) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    files.write_json(folder / RUN_FILE, run)


def read_samples(folder: Path) -> JsonLines[Sample]:
    """Every sample of the folder, in order, and the lines that were none: a torn last line,
    damaged lines between samples (counted, so the report shows what it could not judge).

    Raises:
        StateError: the file cannot be read, or no line of it is a sample (a binary file).
    """
    path = Path(folder) / SAMPLES_FILE
    if not path.exists():
        return JsonLines()
    return read_jsonl(
        path, Sample.model_validate, what="watch sample", hint=_HINT, error=StateError
    )


class SampleLog:
    """Appends samples to ``samples.jsonl``, one flushed and redacted line each."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / SAMPLES_FILE
        files.cut_torn_line(self.path)
        self.log = files.LineLog(self.path)

    def append(self, sample: Sample) -> None:
        self.log.write_json(sample)

    def close(self) -> None:
        self.log.close()
