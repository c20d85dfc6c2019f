"""The SLO search: which concurrencies it probes (doubling, then bisecting), what it concludes,
and that a search on a server (a stub here; the real engine in test_workloads_engine.py) is
saved probe by probe and resumes."""

from __future__ import annotations

import json

import pytest
from openai_stub import openai_stub

from tandem.bench.config import BenchConfig
from tandem.bench.slo_search import SloProbe, SloSearch, next_concurrency, slo_search
from tandem.errors import SpecError
from tandem.report.bench import slo_verdict


def probed(holds_up_to: int, ceiling: int = 256, tolerance: float = 0.1) -> SloSearch:
    """The search a server that holds the objectives up to ``holds_up_to`` would see."""
    search = SloSearch(ttft_s=1.0, tpot_s=None, percentile=90, ceiling=ceiling, tolerance=tolerance)
    while (c := next_concurrency(search)) is not None:
        ok = c <= holds_up_to
        search.probes.append(
            SloProbe(
                concurrency=c,
                passed=ok,
                ttft_s=0.5 if ok else 2.0,
                tpot_s=None,
                output_tok_s=10.0 * min(c, 8),
                goodput_rps=1.0,
            )
        )
    search.finished = True
    return search


@pytest.mark.parametrize(
    ("holds_up_to", "ceiling", "tolerance", "order", "best"),
    [
        (11, 256, 0.1, [1, 2, 4, 8, 16, 12, 10, 11], 11),
        (135, 256, 0.1, [1, 2, 4, 8, 16, 32, 64, 128, 256, 192, 160, 144, 136], 128),
        (135, 256, 0.0, [1, 2, 4, 8, 16, 32, 64, 128, 256, 192, 160, 144, 136, 132, 134, 135], 135),
        (64, 48, 0.1, [1, 2, 4, 8, 16, 32, 48], 48),
        (0, 256, 0.1, [1], None),
        (1, 256, 0.1, [1, 2], 1),
    ],
    ids=[
        "bisects to the boundary",
        "stops within the tolerance",
        "to the exact one without",
        "stops at the ceiling",
        "nothing holds",
        "only one holds",
    ],
)
def test_probes_double_then_bisect(holds_up_to, ceiling, tolerance, order, best):
    search = probed(holds_up_to, ceiling, tolerance)
    assert [p.concurrency for p in search.probes] == order
    assert search.best == best


def test_the_verdict_names_the_answer_the_boundary_and_the_knee():
    search = probed(11)
    assert search.knee == 8  # 10 tok/s a stream, flat from 8 on
    said = slo_verdict(search)
    assert "p90 TTFT ≤ 1000.0 ms hold up to concurrency 11 (12 does not)" in said
    assert "knee at concurrency 8" in said
    assert "no concurrency held" in slo_verdict(probed(0))


def bench(url: str) -> BenchConfig:
    return BenchConfig(
        url=url, output_tokens=4, requests=4, warmup_requests=0, scrape_metrics=False
    )


def test_a_search_is_saved_probe_by_probe_and_resumes(tmp_path):
    out = tmp_path / "slo"
    with openai_stub() as stub:
        search = slo_search(bench(stub.url), out, SloSearch(ttft_s=30.0, ceiling=4))
        assert [p.concurrency for p in search.probes] == [1, 2, 4] and search.best == 4
        assert sorted(p.name for p in out.iterdir()) == ["c1", "c2", "c4", "slo.json"]
        assert all((out / f"c{c}" / "summary.json").exists() for c in (1, 2, 4))
        # killed after its first probe: the saved search goes on from there
        saved = json.loads((out / "slo.json").read_text())
        saved["probes"], saved["finished"] = saved["probes"][:1], False
        (out / "slo.json").write_text(json.dumps(saved))
        sent = len(stub.bodies)
        again = slo_search(bench(stub.url), out, SloSearch(ttft_s=30.0, ceiling=4), resume=True)
        assert [p.concurrency for p in again.probes] == [1, 2, 4] and again.finished
        assert len(stub.bodies) == sent  # c2 and c4 were finished runs: resumed, not re-sent
        with pytest.raises(SpecError) as info:
            slo_search(bench(stub.url), out, SloSearch(ttft_s=1.0, ceiling=4), resume=True)
        with pytest.raises(SpecError) as again_without_resume:
            slo_search(bench(stub.url), out, SloSearch(ttft_s=30.0, ceiling=4))
    assert info.value.field == "slo" and "other objectives" in info.value.message
    assert "already holds an SLO search" in again_without_resume.value.message


def test_each_probe_sends_prompts_no_other_probe_sent(tmp_path):
    """Repeated prompts would be answered from the server's prefix cache, a TTFT no new user
    sees: each probe's prompts are its own."""
    with openai_stub() as stub:
        slo_search(bench(stub.url), tmp_path / "slo", SloSearch(ttft_s=30.0, ceiling=4))
        prompts = [json.dumps(body["messages"]) for body in stub.bodies]
    assert len(prompts) == len(set(prompts)) >= 3


def test_an_objective_no_server_meets_holds_nowhere(tmp_path):
    with openai_stub() as stub:
        search = slo_search(bench(stub.url), tmp_path / "s", SloSearch(ttft_s=1e-6))
    assert [p.concurrency for p in search.probes] == [1] and search.best is None
    with pytest.raises(SpecError):
        slo_search(bench("http://127.0.0.1:9"), tmp_path / "t", SloSearch())


def test_the_command_line_search_writes_its_answer(tmp_path):
    from click.testing import CliRunner

    from tandem.cli import cli

    out = tmp_path / "slo"
    with openai_stub() as stub:
        args = ["bench", "run", "--url", stub.url, "--requests", "2", "--output-tokens", "4"]
        args += ["--warmup", "0", "--no-server-metrics", "--search-slo"]
        done = CliRunner().invoke(
            cli, [*args, "--slo-ttft-ms", "30000", "--search-ceiling", "2", "--out", str(out)]
        )
        refused = CliRunner().invoke(cli, [*args, "--slo-tpot-ms", "50"])
    assert done.exit_code == 0, done.output
    assert "hold up to concurrency 2 (the ceiling 2 was reached)" in (out / "slo.md").read_text()
    assert "--search-slo needs --out" in str(refused.exception)
