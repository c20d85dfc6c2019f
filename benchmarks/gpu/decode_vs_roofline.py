"""Measured decode speed against `tandem plan`'s roofline for the same deployment.

Reads a `tandem bench` run (``summary.json``) and, for each concurrency point, puts the
measured decode rate next to the planner's bound at that concurrency (``tandem plan --json
--concurrency C --context N``; the context is the end of a request, input + output tokens):

- decode tok/s = C / median TPOT: the rate the streams decode at once they are past prefill;
- output tok/s: tokens over the point's wall time, prefill and the ramp included (below it).

The fraction is decode tok/s over the bound. The bound counts bytes only (weights and KV read
once per step at the spec-sheet bandwidth); what it leaves out is said in its docstring
(``tandem.plan.roofline``).

    python3 benchmarks/gpu/decode_vs_roofline.py RUN_DIR \\
        --recipe examples/recipes/gpu-llama8b-tp1.yaml --cluster examples/gpu-cluster-h200.yaml
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path


def bound(opts: argparse.Namespace, concurrency: int, context: int) -> float:
    cmd = [*opts.tandem_cmd, "plan", opts.recipe, "--cluster", opts.cluster, "--json"]
    cmd += ["--concurrency", str(concurrency), "--context", str(context)]
    cmd += ["--model-dir", opts.model_dir] if opts.model_dir else []
    plan = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return plan["roofline"]["at_concurrency"]["decode_tok_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a tandem bench --out folder")
    p.add_argument("--recipe", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--model-dir", help="model headers for tandem plan (default: the HF cache)")
    p.add_argument("--tandem", help="tandem command line (default: python -m tandem.cli)")
    opts = p.parse_args()
    opts.tandem_cmd = (
        shlex.split(opts.tandem) if opts.tandem else [sys.executable, "-m", "tandem.cli"]
    )
    summary = json.loads((opts.run / "summary.json").read_text())
    context = summary["config"]["input_tokens"] + summary["config"]["output_tokens"]
    print(
        f"context {context} tokens ({summary['config']['input_tokens']} in + "
        f"{summary['config']['output_tokens']} out)"
    )
    print(
        "| concurrency | TPOT p50 ms | decode tok/s | output tok/s | roofline tok/s | "
        "decode / roofline |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for point in summary["points"]:
        if point["point"]["kind"] != "concurrency":
            continue
        c = point["point"]["concurrency"]
        m = point["metrics"]
        tpot = m["tpot_s"]["p50"]
        decode = c / tpot
        roof = bound(opts, c, context)
        print(
            f"| {c} | {tpot * 1000:.2f} | {decode:.1f} | {m['output_throughput_tok_s']:.1f} | "
            f"{roof:.1f} | {decode / roof:.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
