"""An ``--out`` folder holds one run (issue 46, class 1): its mark names the command and the
options that identify the run, and another command or other options are refused before
anything is created or sent, naming the folder, what it holds and the fix.

The rule is ``tandem.ownership.claim_output``'s, table-driven here; the commands are shown
using it through the CLI against the stub server (nothing of an earlier run is deleted).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.errors import SpecError
from tandem.ownership import OUTPUT_MARK, RunKind, RunMark, claim_output
from tests.openai_stub import openai_stub

BENCH = RunKind("bench run", "a bench run", is_own=lambda f: (f / "summary.json").is_file())
SMOKE = RunKind("eval smoke", "a smoke run", is_own=lambda f: (f / "smoke.jsonl").is_file())
WATCH = RunKind("watch run", "a watch", resume_flag=None, is_own=lambda f: False)
RUN = {"url": "http://h:8000", "concurrency": [1, 2]}


def folder_of(tmp_path: Path, mark: RunMark | str | None, *names: str) -> Path:
    """A folder holding ``names`` and the mark (a RunMark, an earlier tandem's empty mark "",
    or none)."""
    out = tmp_path / "out"
    out.mkdir()
    for name in names:
        (out / name).write_text("{}")
    if isinstance(mark, RunMark):
        (out / OUTPUT_MARK).write_text(mark.model_dump_json())
    elif mark == "":
        (out / OUTPUT_MARK).touch()
    return out


def bench_mark(**run) -> RunMark:
    return RunMark(command="bench run", run=RUN | run)


ACCEPTED = {
    "an empty folder": (None, (), BENCH, {}, False),
    "a folder holding only a mark of another run": (
        RunMark(command="eval smoke", run={}),
        (),
        BENCH,
        {},
        False,
    ),
    "the same run, resumed": (bench_mark(), ("summary.json",), BENCH, {"resume": True}, True),
    "a watch of the same deployment, continued by itself": (
        RunMark(command="watch run", run=RUN),
        ("watch.json",),
        WATCH,
        {},
        True,
    ),
    "an earlier tandem's unmarked bench folder, resumed": (
        None,
        ("summary.json", "requests.jsonl"),
        BENCH,
        {"resume": True},
        True,
    ),
    "an earlier tandem's empty mark, resumed": (
        "",
        ("summary.json",),
        BENCH,
        {"resume": True},
        True,
    ),
    "another run's folder with --force": (
        RunMark(command="eval smoke", run={}),
        ("smoke.jsonl",),
        BENCH,
        {"force": True},
        False,
    ),
}


@pytest.mark.parametrize("mark,names,kind,flags,continues", ACCEPTED.values(), ids=ACCEPTED)
def test_a_folder_of_this_run_is_accepted(tmp_path, mark, names, kind, flags, continues):
    out = folder_of(tmp_path, mark, *names)
    claim = claim_output(out, kind, RUN, **flags)
    assert claim.continues is continues
    before = sorted(p.name for p in out.iterdir())
    assert claim.make() == out
    assert RunMark.model_validate_json((out / OUTPUT_MARK).read_text()).command == kind.command
    assert set(before) - {OUTPUT_MARK} <= {p.name for p in out.iterdir()}  # nothing removed


def test_a_new_folder_is_created_only_when_the_claim_is_made(tmp_path):
    claim = claim_output(tmp_path / "a" / "b", BENCH, RUN)
    assert not (tmp_path / "a").exists()
    claim.make()
    assert json.loads((tmp_path / "a" / "b" / OUTPUT_MARK).read_text())["run"] == RUN


REFUSED = {
    "another command's run": (
        RunMark(command="eval smoke", run={"model": "tiny"}),
        ("smoke.jsonl",),
        {"resume": True},
        ["holds a run of `tandem eval smoke`", 'model "tiny"', "--out", "--force"],
    ),
    "the same command with other options": (
        bench_mark(concurrency=[8]),
        ("summary.json",),
        {"resume": True},
        ["with other options", "concurrency: the run there has [8], this one [1, 2]", "--resume"],
    ),
    "the same run without --resume": (
        bench_mark(),
        ("summary.json",),
        {},
        ["holds an earlier run of `tandem bench run`", "pass --resume to continue it"],
    ),
    "an earlier tandem's bench folder without --resume": (
        None,
        ("summary.json",),
        {},
        ["holds an earlier run", "recorded no options", "--resume"],
    ),
    "an earlier tandem's folder of another kind": (
        "",
        ("smoke.jsonl",),
        {"resume": True},
        ["holds the files of another tandem run (smoke.jsonl)", "--force"],
    ),
    "files tandem did not write": (
        None,
        ("notes.txt",),
        {"resume": True},
        ["holds files tandem did not write (notes.txt)", "--force"],
    ),
}


@pytest.mark.parametrize("mark,names,flags,said", REFUSED.values(), ids=REFUSED)
def test_a_folder_of_another_run_is_refused_naming_it_and_the_fix(
    tmp_path, mark, names, flags, said
):
    out = folder_of(tmp_path, mark, *names)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SpecError) as refused:
        claim_output(out, BENCH, RUN, flag_of=lambda name: f"--{name}", **flags)
    text = str(refused.value)
    assert str(out) in text and refused.value.field == "--out"
    assert all(part in text for part in said), text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_run_compares_with_its_mark_as_written_redacted(tmp_path):
    """A URL's password is never in the mark; the run that wrote it still matches it."""
    run = {"url": "http://user:s3cretpass@h:8000"}
    claim_output(tmp_path / "out", BENCH, run).make()
    (tmp_path / "out" / "summary.json").write_text("{}")
    assert "s3cretpass" not in (tmp_path / "out" / OUTPUT_MARK).read_text()
    assert claim_output(tmp_path / "out", BENCH, run, resume=True).continues


# --- the commands -------------------------------------------------------------------------------


def test_a_second_smoke_into_a_smoke_folder_keeps_the_first_verdicts(tandem_here, tmp_path):
    out = tmp_path / "smoke"
    with openai_stub() as stub:
        smoke = ["eval", "smoke", "--url", stub.url, "--check", "tools", "--out", str(out)]
        assert tandem_here(*smoke).code == 0
        first = (out / "smoke.jsonl").read_text()
        again = tandem_here(*smoke)
        assert again.code == 2 and str(out) in again.err
        assert "earlier run of `tandem eval smoke`" in again.err and "--resume" in again.err
        assert (out / "smoke.jsonl").read_text() == first
        assert tandem_here(*smoke, "--resume").code == 0  # nothing left to run: kept


SMALL_BENCH = ["--requests", "1", "--warmup", "0", "--output-tokens", "4", "--no-server-metrics"]


def bench_args(url: str, out: Path, prompts: Path, *more: str) -> list[str]:
    prompts.write_text("hello there\n")
    return ["bench", "--url", url, "--prompt-file", str(prompts), *SMALL_BENCH, "--no-plots",
            "-q", "--out", str(out), *more]  # fmt: skip


def test_a_bench_into_a_smoke_folder_is_refused_before_any_request(tandem_here, tmp_path):
    out = tmp_path / "run"
    with openai_stub() as stub:
        smoke = ["eval", "smoke", "--url", stub.url, "--check", "tools", "--out", str(out)]
        assert tandem_here(*smoke).code == 0
        asked = len(stub.authorizations)
        refused = tandem_here(*bench_args(stub.url, out, tmp_path / "p.txt"))
        assert refused.code == 2 and "holds a run of `tandem eval smoke`" in refused.err
        assert "--force" in refused.err and len(stub.authorizations) == asked
        assert not (out / "summary.json").exists()


def test_a_resumed_bench_with_other_options_is_refused_naming_them(tandem_here, tmp_path):
    out = tmp_path / "b"
    with openai_stub() as stub:
        assert tandem_here(*bench_args(stub.url, out, tmp_path / "p.txt")).code == 0
        sent = len(stub.bodies)
        args = bench_args(stub.url, out, tmp_path / "p.txt", "--resume", "--output-tokens", "7")
        refused = tandem_here(*args)
        assert refused.code == 2 and "with other options" in refused.err, refused.err
        assert "--output-tokens: the run there has 4, this one 7" in refused.err
        assert len(stub.bodies) == sent


def test_a_bench_folder_of_an_earlier_tandem_is_resumed(tandem_here, tmp_path):
    """Before marks named their run, a bench folder had none (or an empty one): its files
    show it is a bench run, so --resume takes it (and without --resume it is refused)."""
    out = tmp_path / "b"
    with openai_stub() as stub:
        assert tandem_here(*bench_args(stub.url, out, tmp_path / "p.txt")).code == 0
        (out / OUTPUT_MARK).unlink()
        refused = tandem_here(*bench_args(stub.url, out, tmp_path / "p.txt"))
        assert refused.code == 2 and "recorded no options" in refused.err
        resumed = tandem_here(*bench_args(stub.url, out, tmp_path / "p.txt", "--resume"))
        assert resumed.code == 0, resumed.err
        assert RunMark.model_validate_json((out / OUTPUT_MARK).read_text()).command == "bench run"


def test_a_smoke_run_is_its_server_and_model_so_a_resume_may_give_other_lengths(
    tandem_here, tmp_path
):
    out = tmp_path / "smoke"
    with openai_stub() as stub:
        smoke = ["eval", "smoke", "--url", stub.url, "--check", "tools", "--out", str(out)]
        assert tandem_here(*smoke, "--needle-lengths", "64").code == 0
        assert tandem_here(*smoke, "--resume").code == 0
