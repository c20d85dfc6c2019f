"""compare, the Markdown report and the CLI, from summaries built in the test."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from tandem.bench.compare import compare, load_summary
from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import BenchResult, LoadPointResult, ServerInfo, read_records
from tandem.bench.metrics import load_point_metrics
from tandem.bench.server_metrics import ServerDelta
from tandem.bench.workload import LoadPoint
from tandem.cli import cli
from tandem.errors import SpecError
from tandem.report.bench import comparison_markdown, markdown

from .test_metrics import rec


def result(ttft: float, gap: float) -> BenchResult:
    records = [rec(i, ttft=ttft, gaps=(gap, gap, gap), start=i * 0.5) for i in range(4)]
    point = LoadPoint(
        label="c1", kind="concurrency", concurrency=1, requests=4, input_tokens=10, output_tokens=4
    )
    return BenchResult(
        config=BenchConfig(url="http://h:8000"),
        server=ServerInfo(url="http://h:8000", model="tiny"),
        finished=True,
        points=[LoadPointResult(point=point, metrics=load_point_metrics(records))],
    )


def test_compare_gives_relative_change_and_the_better_side():
    comp = compare(result(0.1, 0.01), result(0.05, 0.02))
    figures = {f.key: f for f in comp.points[0].figures}
    assert (
        figures["ttft_p50_s"].relative == pytest.approx(-0.5)
        and figures["ttft_p50_s"].better == "b"
    )
    assert (
        figures["tpot_p50_s"].relative == pytest.approx(1.0) and figures["tpot_p50_s"].better == "a"
    )
    assert comp.only_in_a == [] and comp.only_in_b == []
    table = comparison_markdown(comp)
    assert "| c1 | TTFT p50 (ms) | 100.0 | 50.0 | -50.0% | B |" in table
    # a rate is not a latency: printed as it is, not as milliseconds
    rate = f"{figures['output_throughput_tok_s'].a:.1f}"
    assert f"| c1 | output tok/s | {rate} |" in table, table


def test_markdown_report_lists_every_point_with_ms():
    text = markdown(result(0.1, 0.01))
    assert "# tandem bench: tiny" in text
    assert "| c1 | concurrency 1 | 4/4 | 100.0 |" in text
    assert "| TPOT | 4 | 10.0 |" in text
    assert "server's own TTFT" not in text  # no server figures in this summary


def test_markdown_puts_the_servers_ttft_beside_the_clients():
    r = result(0.1, 0.01)
    r.points[0].server = ServerDelta(
        ttft_requests=4, ttft_mean_s=0.094, queue_mean_s=0.0005, prefill_mean_s=0.08
    )
    assert (
        "The server's own TTFT over its 4 requests: mean 94.0 ms (scheduler queue 0.5, prefill "
        "80.0); the client's mean 100.0 ms, so the HTTP path and the client add 6.0 ms."
    ) in markdown(r)
    figures = {f.key: f for f in compare(result(0.1, 0.01), r).points[0].figures}
    assert figures["server_ttft_mean_s"].b == 0.094 and figures["server_ttft_mean_s"].a is None


def test_cli_compare_reads_run_folders_and_summary_paths(tmp_path):
    for name, r in (("a", result(0.1, 0.01)), ("b", result(0.2, 0.01))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(r.model_dump_json())
    out = CliRunner().invoke(
        cli,
        [
            "bench",
            "compare",
            str(tmp_path / "a"),
            str(tmp_path / "b" / "summary.json"),
            "--markdown",
        ],
    )
    assert out.exit_code == 0, out.output
    assert "| c1 | TTFT p50 (ms) | 100.0 | 200.0 | +100.0% | A |" in out.output


def test_a_file_that_is_not_a_summary_is_a_spec_error(tmp_path):
    bad = tmp_path / "summary.json"
    bad.write_text(json.dumps({"hello": 1}))
    try:
        load_summary(tmp_path)
    except Exception as exc:  # noqa: BLE001
        assert type(exc).__name__ == "SpecError" and exc.file == str(bad)
    else:
        raise AssertionError("expected SpecError")


def test_bench_without_subcommand_runs_and_help_lists_subcommands():
    runner = CliRunner()
    helped = runner.invoke(cli, ["bench", "-h"])
    assert helped.exit_code == 0 and "compare" in helped.output and "run" in helped.output
    run_help = runner.invoke(cli, ["bench", "--concurrency", "1", "-h"])
    assert run_help.exit_code == 0 and "--output-tokens" in run_help.output


def test_bench_deployment_takes_url_and_model_from_its_state(tmp_path, monkeypatch):
    from tandem.backends.state import DeploymentState
    from tandem.errors import EndpointError

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    DeploymentState(
        name="d1",
        backend="local",
        recipe={},
        cluster={},
        endpoint="http://127.0.0.1:9",
        model="tiny",
    ).save()
    out = CliRunner().invoke(cli, ["bench", "d1", "--quiet"])
    assert isinstance(out.exception, EndpointError)
    assert "http://127.0.0.1:9/v1/models" in out.exception.message


def test_a_report_piped_to_a_file_keeps_the_whole_table(tmp_path, monkeypatch):
    """Off a terminal rich would squeeze the 13 columns into 80 and cut "srv TTFT mean" to
    "srv…"; piped, the table is printed at its own width, every header and figure whole."""
    monkeypatch.delenv("COLUMNS", raising=False)
    (tmp_path / "summary.json").write_text(result(0.1, 0.01).model_dump_json())
    out = CliRunner().invoke(cli, ["bench", "report", str(tmp_path), "--no-plots"])
    assert out.exit_code == 0, out.output
    header = next(line for line in out.output.splitlines() if "point" in line)
    for name in ("TTFT p50", "srv TTFT mean", "out tok/s", "server gen tok"):
        assert name in header, out.output
    assert "…" not in out.output and max(map(len, out.output.splitlines())) > 80


def _run_folder(tmp_path, requests: bytes):
    (tmp_path / "summary.json").write_text(result(0.1, 0.01).model_dump_json())
    (tmp_path / "requests.jsonl").write_bytes(requests)
    return tmp_path


def test_a_damaged_request_line_is_counted_not_a_traceback(tmp_path, tandem_here):
    lines = [rec(i).model_dump_json().encode() + b"\n" for i in range(3)]
    folder = _run_folder(tmp_path, lines[0] + b'{"index": 1, "load_po\n' + lines[1] + lines[2])
    read = read_records(folder / "requests.jsonl")
    assert len(read.records) == 3 and read.damaged == [2]
    done = tandem_here("bench", "report", str(folder))
    assert done.code == 0, done.err
    assert "requests.jsonl: 1 damaged line(s) skipped (line 2)" in done.err
    assert list(folder.glob("*.png")), "the plots are drawn from the other records"


def test_a_binary_request_log_is_one_message(tmp_path, tandem_here):
    folder = _run_folder(tmp_path, gzip.compress(rec(0).model_dump_json().encode() * 30))
    done = tandem_here("bench", "report", str(folder))
    assert done.code == 2 and "Traceback" not in done.err
    assert f"{folder / 'requests.jsonl'}: no line is a request record" in done.err
    assert "line 1: not UTF-8 text" in done.err


def test_a_gzipped_summary_names_its_line(tmp_path):
    (tmp_path / "summary.json").write_bytes(
        gzip.compress(result(0.1, 0.01).model_dump_json().encode())
    )
    with pytest.raises(SpecError, match="line 1: not UTF-8 text"):
        load_summary(tmp_path)


def test_compare_names_the_settings_the_runs_differ_in(tmp_path, tandem_here):
    a, b = result(0.1, 0.01), result(0.1, 0.01)
    b.config = b.config.model_copy(update={"output_tokens": 512, "temperature": 0.7})
    assert [(d.name, d.a, d.b) for d in compare(a, b).settings_differ] == [
        ("output_tokens", 128, 512),
        ("temperature", None, 0.7),
    ]
    b.config = b.config.model_copy(update={"url": "http://other:8000"})  # what an A/B is about
    assert [d.name for d in compare(a, b).settings_differ] == ["output_tokens", "temperature"]
    for name, run in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(run.model_dump_json())
    done = tandem_here("bench", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--markdown")
    assert done.code == 0
    assert "warning: the runs were measured with different settings" in done.err
    assert "output_tokens (A 128, B 512), temperature (A None, B 0.7)" in done.err
    assert "**Warning**" in done.out and "output_tokens (A 128, B 512)" in done.out
    same = compare(a, result(0.1, 0.01))
    assert same.settings_differ == [] and "Warning" not in comparison_markdown(same)


def rounds_result(ttfts: list[float], gap: float = 0.01) -> BenchResult:
    """A run of one point measured once per TTFT given (a round each)."""
    runs = [result(ttft, gap) for ttft in ttfts]
    base = runs[0]
    base.config = base.config.model_copy(update={"rounds": len(ttfts)})
    base.points = [
        p.model_copy(update={"point": p.point.model_copy(update={"round": r})})
        for r, run in enumerate(runs, 1)
        for p in run.points
    ]
    return base


def test_compare_takes_medians_over_rounds_and_says_what_is_beyond_the_noise():
    a = rounds_result([0.100, 0.102, 0.098, 0.101, 0.099])
    slower = rounds_result([0.120, 0.118, 0.122, 0.121, 0.119])
    comp = compare(a, slower)
    ttft = {f.key: f for f in comp.points[0].figures}["ttft_p50_s"]
    assert (ttft.a, ttft.b) == pytest.approx((0.100, 0.120))
    assert ttft.noise is not None and ttft.noise.verdict == "beyond-noise"
    assert ttft.better == "a" and ttft.beyond_noise
    verdict = comp.verdict()
    assert not verdict.passed
    # the slower first token moves E2EL and throughput too; TPOT and ITL stay (the same gaps)
    assert [r.figure.key for r in verdict.worse] == [
        "ttft_p50_s",
        "ttft_p99_s",
        "e2el_p50_s",
        "output_throughput_tok_s",
        "request_throughput_rps",
    ]
    assert verdict.better == [] and verdict.undecided == []
    same = compare(a, rounds_result([0.101, 0.099, 0.100, 0.103, 0.097]))
    assert same.verdict().passed and same.verdict().worse == []


def test_one_round_a_side_is_undecided_not_a_regression():
    comp = compare(result(0.1, 0.01), result(0.2, 0.01))
    verdict = comp.verdict()
    assert verdict.passed and verdict.worse == [] and verdict.undecided
    assert "too few rounds to tell" in comparison_markdown(comp)


def test_the_cli_gate_exits_1_when_b_is_worse_beyond_the_noise(tmp_path, tandem_here):
    runs = {
        "a": rounds_result([0.100, 0.102, 0.098, 0.101]),
        "b": rounds_result([0.100, 0.101, 0.099, 0.102]),
        "worse": rounds_result([0.150, 0.152, 0.149, 0.151]),
    }
    for name, run in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(run.model_dump_json())
    a, b, worse = (str(tmp_path / name) for name in runs)
    passed = tandem_here("bench", "compare", a, b, "--fail-if-worse")
    assert passed.code == 0, passed.err
    assert "verdict: no difference beyond the noise (95%)" in passed.out
    failed = tandem_here("bench", "compare", a, worse, "--fail-if-worse")
    assert failed.code == 1
    assert "verdict: B is worse beyond the noise (95%) in c1 TTFT p50 (+49.8%)" in failed.out
    assert "error: B is worse than A beyond the noise in 5 figure(s): c1 TTFT p50" in failed.err
    assert tandem_here("bench", "compare", a, worse).code == 0  # without the gate: a report


def test_the_report_gives_medians_over_rounds_with_their_intervals():
    text = markdown(rounds_result([0.100, 0.110, 0.090, 0.105, 0.095, 0.120]))
    assert "## c1 #6: concurrency 1" in text and "## Rounds" in text
    assert "| c1 | TTFT p50 | 6 | 102.5 | 90.0 | 120.0 | 96.9% |" in text


def test_the_report_shows_turns_prefix_hits_and_the_prompt_file():
    from tandem.bench.datasets import DatasetSummary
    from tandem.bench.metrics import LatencyStats

    records = [
        rec(i, ttft=0.05 * turn, prompt=40 * turn).model_copy(update={"turn": turn})
        for i, turn in enumerate([1, 2, 1, 2])
    ]
    run = result(0.1, 0.01)
    run.points[0].metrics = load_point_metrics(records)
    run.points[0].server = ServerDelta(
        prefix_caching=True,
        prefix_cache_queries=400,
        prefix_cache_hits=100,
        prefix_cache_hit_rate=0.25,
    )
    run.config = run.config.model_copy(update={"turns": 2, "prompt_file": "d.json"})
    run.dataset = DatasetSummary(
        file="d.json",
        format="json",
        rows=10,
        measured=5,
        too_long=1,
        sent=4,
        distinct=4,
        prompt_tokens=LatencyStats.of([40.0, 41.0, 42.0, 43.0]),
    )
    text = markdown(run)
    assert "prompts from d.json, 128 out tokens, 2 turns" in text
    assert "| 2 | 2/2 | 80 | 100.0 | 100.0 |" in text  # turn 2: 80 prompt tokens, TTFT 100 ms
    assert "prefix cache hit rate 25.0% (100 of 400 prompt tokens found cached)" in text
    assert "| c1 | concurrency 1 | 4/4 |" in text and "| 25.0% |" in text
    assert "4 conversations from 4 of the 10 rows of `d.json` (json)" in text
    run.points[0].server = ServerDelta(prefix_caching=False, prefix_cache_queries=0)
    assert "prefix caching off on the server" in markdown(run)
