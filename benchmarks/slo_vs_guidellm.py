"""tandem bench's SLO search against GuideLLM's goodput search (PyPI): same server, same
objectives, same workload, one after the other.

Both double the concurrency from 1 until a level misses the objectives, then bisect to within
a tolerance of the largest passing one. They judge a level differently: tandem holds each
figure's percentile to its objective (p90 TTFT ≤ X and p90 TPOT ≤ Y), GuideLLM the fraction of
requests that meet every objective at once (its "attainment", here 0.90). A level where both
figures pass at p90 can still miss 90 % joint attainment when the slow TTFTs and the slow TPOTs
fall on different requests, so GuideLLM's answer may sit one step lower; the table shows each
level's figures from both.

GuideLLM is given the run as a scenario file (`guidellm run --scenario FILE`): the OpenAI HTTP
backend, synthetic text of the same lengths measured with the served model's tokenizer (the
`/v1/models` root), `max_requests` per level as tandem's `--requests`.

Two things keep the comparison fair. The server runs with ``enable_prefix_caching: false``:
both tools seed their prompts, so a second run sends the first one's prompts again, and vLLM's
prefix cache answers them with a TTFT no new user sees (within one search each of tandem's
probes sends its own, ``tandem.bench.slo_search.probe_seed``). And on a small host the server
and the clients run on cores of their own (the node's ``cpus`` in the cluster, ``taskset`` for
this script), so neither tool's client takes cycles from the server the other one measured.

Usage (a deployment up, GuideLLM in a venv of its own):
    python3 -m venv /tmp/gl && /tmp/gl/bin/pip install guidellm==0.8.1
    taskset -c 0 .venv/bin/python benchmarks/slo_vs_guidellm.py --url http://10.93.0.1:8000 \\
        --model smollm2 --guidellm /tmp/gl/bin/guidellm --ttft-ms 450 --tpot-ms 70 \\
        --guidellm-workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from depth_vs_llama_benchy import model_root  # a sibling script: benchmarks/ is on sys.path

from tandem.bench.config import BenchConfig
from tandem.bench.slo_search import SloSearch, slo_search


def guidellm_scenario(a: argparse.Namespace, out: Path) -> dict:
    backend = {
        "kind": "openai_http",
        "target": f"{a.url}/v1",
        "model": a.model,
        "request_format": "/v1/chat/completions",
    }
    if a.api_key:
        backend["api_key"] = a.api_key
    return {
        "spec": {
            "backend": backend,
            "profile": {
                "kind": "goodput",
                "target_attainment": a.percentile / 100,
                "initial_streams": 1,
                "max_streams": a.ceiling,
                "tolerance": a.tolerance,
            },
            "data": [
                {
                    "kind": "synthetic_text",
                    "prompt_tokens": a.input_tokens,
                    "output_tokens": a.output_tokens,
                }
            ],
            "tokenizer": {"kind": "hf_auto", "model": a.tokenizer},
            "constraints": [{"kind": "max_requests", "count": a.requests}],
            "metrics": {"kind": "generative", "slo": {"ttft_ms": a.ttft_ms, "tpot_ms": a.tpot_ms}},
            "outputs": [{"kind": "json", "path": str(out)}],
        }
    }


def search_states(node: object) -> list[dict]:
    """Every GuideLLM goodput search state (a dict with ``probes``) inside its JSON output."""
    found: list[dict] = []
    if isinstance(node, dict):
        if isinstance(node.get("probes"), list) and "best_passing_streams" in node:
            found.append(node)
        for value in node.values():
            found += search_states(value)
    elif isinstance(node, list):
        for value in node:
            found += search_states(value)
    return found


def guidellm_levels(report: dict, q: str) -> dict[int, tuple[float, float]]:
    """Each probed level's percentile TTFT and ITL (ms, the ITL its ``tpot_ms`` objective is held
    to) over its successful requests, from GuideLLM's per-level benchmarks."""
    levels: dict[int, tuple[float, float]] = {}
    for bench in report.get("benchmarks", []):
        streams, metrics = bench["config"]["strategy"].get("streams"), bench["metrics"]
        figures = [
            metrics[name]["successful"]["percentiles"][q]
            for name in ("time_to_first_token_ms", "inter_token_latency_ms")
        ]
        if isinstance(streams, int) and None not in figures:
            levels[streams] = (figures[0], figures[1])
    return levels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--guidellm", default="guidellm", help="its command line")
    p.add_argument("--tokenizer", help="folder with the tokenizer; default: /v1/models root")
    p.add_argument("--ttft-ms", type=float, required=True)
    p.add_argument("--tpot-ms", type=float, required=True)
    p.add_argument("--percentile", type=int, default=90)
    p.add_argument("--ceiling", type=int, default=16)
    p.add_argument("--tolerance", type=float, default=0.1)
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=24, help="requests per probed level")
    p.add_argument(
        "--guidellm-workers",
        type=int,
        help="GuideLLM's worker processes (GUIDELLM__MAX_WORKER_PROCESSES, 10 by default): on a "
        "small host they share the server's cores",
    )
    p.add_argument("--json", type=Path, help="also write both searches here")
    a = p.parse_args()
    a.url = a.url.rstrip("/").removesuffix("/v1")
    a.tokenizer = a.tokenizer or model_root(a.url, a.model, a.api_key)
    with tempfile.TemporaryDirectory(prefix="slo-vs-guidellm-") as folder:
        work = Path(folder)
        config = BenchConfig(
            url=a.url,
            model=a.model,
            api_key=a.api_key,
            input_tokens=a.input_tokens,
            output_tokens=a.output_tokens,
            requests=a.requests,
            warmup_requests=1,
            kv_sample_interval_s=0,
        )
        wanted = SloSearch(
            ttft_s=a.ttft_ms / 1000,
            tpot_s=a.tpot_ms / 1000,
            percentile=a.percentile,
            ceiling=a.ceiling,
            tolerance=a.tolerance,
        )
        ours = slo_search(config, work / "tandem", wanted)
        print(f"tandem: {[(q.concurrency, q.passed) for q in ours.probes]}", flush=True)
        workers = (
            {"GUIDELLM__MAX_WORKER_PROCESSES": str(a.guidellm_workers)}
            if a.guidellm_workers
            else {}
        )
        scenario = work / "scenario.json"
        scenario.write_text(json.dumps(guidellm_scenario(a, work / "guidellm.json")))
        done = subprocess.run(
            [*shlex.split(a.guidellm), "run", "--scenario", str(scenario), "--disable-progress"],
            capture_output=True,
            text=True,
            env={**os.environ, **workers},
        )
        if done.returncode or not (work / "guidellm.json").exists():
            said = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            raise SystemExit(f"guidellm failed ({done.returncode}):\n{said}")
        report = (work / "guidellm.json").read_text()
        states = search_states(json.loads(report))
        figures = guidellm_levels(json.loads(report), f"p{a.percentile}")
        if a.json:  # GuideLLM's whole report, for its per-level distributions
            a.json.with_suffix(".guidellm.json").write_text(report)
    if not states:
        raise SystemExit("no goodput search state in GuideLLM's output")
    theirs = states[0]
    by_level: dict[int, dict] = {}
    for probe in ours.probes:
        by_level.setdefault(probe.concurrency, {})["tandem"] = probe
    for probe in theirs["probes"]:
        by_level.setdefault(probe["streams"], {})["guidellm"] = probe
    q = f"p{a.percentile}"
    print(f"| concurrency | tandem {q} TTFT ms | tandem {q} TPOT ms | tandem held | "
          f"GuideLLM {q} TTFT ms | GuideLLM {q} ITL ms | GuideLLM attainment | "
          "GuideLLM held |")  # fmt: skip
    print("|---:|---:|---:|---|---:|---:|---:|---|")
    for level in sorted(by_level):
        mine, other = by_level[level].get("tandem"), by_level[level].get("guidellm")
        cells = (
            [
                f"{mine.ttft_s * 1000:.1f}",
                f"{mine.tpot_s * 1000:.1f}",
                "yes" if mine.passed else "NO",
            ]
            if mine and mine.ttft_s is not None and mine.tpot_s is not None
            else ["–", "–", "–"]
        )
        cells += [f"{ms:.1f}" for ms in figures[level]] if level in figures else ["–", "–"]
        cells += (
            [f"{other['attainment']:.3f}", "yes" if other["passed"] else "NO"]
            if other
            else ["–", "–"]
        )
        print(f"| {level} | " + " | ".join(cells) + " |")
    print()
    print(f"tandem: holds up to concurrency {ours.best} ({len(ours.probes)} probes); "
          f"GuideLLM: {theirs['best_passing_streams']} ({len(theirs['probes'])} probes, "
          f"stopped: {theirs.get('stop_reason')})")  # fmt: skip
    if a.json:
        a.json.write_text(
            json.dumps({"tandem": ours.model_dump(), "guidellm": theirs}, indent=2, default=str)
        )


if __name__ == "__main__":
    main()
