"""report.html and points.csv of a run: one file that opens offline with every plot inside it,
and numbers a spreadsheet reads. A real headless Chromium (Debian's) opens the page and draws
it: the plots must be on screen, not broken images."""

from __future__ import annotations

import asyncio
import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from openai_stub import openai_stub

from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import BenchResult, LoadGenerator
from tandem.cli.bench import write_reports
from tandem.report.bench_html import CSV_FIELDS


def depth_run(out: Path) -> BenchResult:
    with openai_stub() as stub:
        config = BenchConfig(
            url=stub.url,
            output_tokens=4,
            warmup_requests=0,
            scrape_metrics=False,
            concurrency=[1, 2],
            depths=[0, 40],
            requests=2,
        )
        return asyncio.run(LoadGenerator(config, out).arun())


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("html")
    return out, write_reports(depth_run(out), out, plots=True)


def test_the_page_holds_every_plot_and_fetches_nothing(written):
    out, files = written
    page = (out / "report.html").read_text()
    plots = [f for f in files if f.suffix == ".png"]
    assert len(plots) == 4 and page.count('src="data:image/png;base64,') == len(plots)
    assert not re.search(r"<script|<link|@import|(src|href)=\"(https?:)?//", page)
    assert "Context depth" in page and "c2-d40" in page


def test_points_csv_has_a_row_a_point_in_numbers(written):
    out, _ = written
    rows = list(csv.DictReader((out / "points.csv").open()))
    assert list(rows[0]) == list(CSV_FIELDS)
    assert [(r["point"], r["depth_tokens"]) for r in rows] == [
        ("c1-d0", "0"),
        ("c2-d0", "0"),
        ("c1-d40", "40"),
        ("c2-d40", "40"),
    ]
    assert all(float(r["ttft_p50_s"]) > 0 and r["completed"] == "2" for r in rows)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"), reason="no chromium (apt-get install chromium)"
)
def test_chromium_draws_the_plots_offline(written, tmp_path):
    """The page as a browser draws it, with the network off: matplotlib's first two line
    colours (blue #1f77b4, orange #ff7f0e) are on screen only if the embedded PNGs decoded
    (a broken image is a small grey icon; the page's own styles use neither colour)."""
    assert CHROMIUM, "CI installs Debian's chromium (.ci/run)"
    out, _ = written
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # as root, as CI runs
            "--disable-gpu",
            "--proxy-server=127.0.0.1:9",  # nothing reachable: the page must need nothing
            "--window-size=1280,4000",
            f"--screenshot={shot}",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    import matplotlib.image

    pixels = (matplotlib.image.imread(shot)[:, :, :3] * 255).round().astype(int)

    def drawn(rgb: tuple[int, int, int]) -> int:
        return int(((abs(pixels - rgb)).sum(axis=2) < 24).sum())

    assert drawn((31, 119, 180)) > 500 and drawn((255, 127, 14)) > 500  # ~2000 and ~1100 seen
