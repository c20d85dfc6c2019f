"""`tandem check --fabric` against a plain torch NCCL all-reduce in the same kind of namespaces.

Rounds interleave the two: ``tandem check RECIPE --cluster CLUSTER --fabric --json`` (its own
throw-away namespaces, its own all-reduce) and ``nccl_allreduce_ref.py`` started by hand, one
rank per node with ``ip netns exec`` in namespaces built like tandem's (same subnet, addresses
and interface names), with the variables a person sets for it: the node's own ones from the
cluster file (``CUDA_VISIBLE_DEVICES``, ``NCCL_HOSTID``), ``NCCL_SOCKET_IFNAME`` and the
caller's environment (the machine's multicast-off rule). Both use the same message sizes.
Prints bus bandwidth per size, tandem / reference, and the peak ratio (goal: >= 0.95).

On the one-GPU machine both "nodes" use GPU 0 and NCCL talks over the veth (NET/Socket).

    python3 benchmarks/gpu/fabric_vs_torch.py --recipe examples/recipes/gpu-llama8b.yaml \\
        --cluster examples/gpu-cluster-1gpu.yaml --tandem "python3 -m tandem.cli" --out $OUT/fabric
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tandem.backends import netns
from tandem.check.fabric import parse_nccl_transports
from tandem.spec.loading import load_cluster

SIZES = [1 << k for k in range(10, 29, 2)]
"""tandem's NCCL default, 1 KiB .. 256 MiB (``--sizes`` for others)."""
REF = Path(__file__).with_name("nccl_allreduce_ref.py")


def tandem_round(opts: argparse.Namespace, out: Path) -> dict:
    result = subprocess.run(
        [
            *opts.tandem_cmd,
            "check",
            opts.recipe,
            "--cluster",
            opts.cluster,
            "--fabric",
            "--fabric-sizes",
            ",".join(map(str, SIZES)),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out.write_text(result.stdout + "\n--- stderr\n" + result.stderr)
    try:
        fabric = json.loads(result.stdout)["fabric"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise SystemExit(f"tandem check gave no fabric result:\n{result.stderr[-2000:]}") from None
    if not fabric or not fabric.get("sizes"):
        raise SystemExit(f"tandem check's fabric test failed: {json.dumps(fabric)[:2000]}")
    return {s["bytes"]: s["busbw_gbps"] for s in fabric["sizes"]} | {
        "transports": fabric.get("transports"),
        "network": fabric.get("nccl_network"),
    }


def reference_round(opts: argparse.Namespace, out: Path) -> dict:
    cluster = load_cluster(Path(opts.cluster))
    plan = netns.network_plan(f"ref{os.getpid()}", cluster)
    netns.sweep_orphans()  # what a killed earlier run left
    netns.create(plan, purpose="benchmarks/gpu/fabric_vs_torch.py")
    procs = []
    try:
        for rank, (node, net) in enumerate(zip(cluster.nodes, plan.nodes, strict=True)):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(len(cluster.nodes)),
                MASTER_ADDR=cluster.nodes[0].address,
                MASTER_PORT="29633",
                NCCL_SOCKET_IFNAME=net.interface,
                GLOO_SOCKET_IFNAME=net.interface,
                NCCL_DEBUG="INFO",
                **node.env,
            )
            cmd = ["ip", "netns", "exec", net.netns, sys.executable, str(REF)]
            cmd += ["--sizes", ",".join(map(str, SIZES))]
            log = out.with_name(f"{out.stem}-rank{rank}.log")
            with log.open("w") as f:
                procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT))
        for p in procs:
            p.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        netns.destroy(plan)
    text = out.with_name(f"{out.stem}-rank0.log").read_text()
    line = next((x for x in text.splitlines() if x.startswith("REF ")), None)
    if line is None:
        raise SystemExit(f"the reference printed no result:\n{text[-2000:]}")
    data = json.loads(line.removeprefix("REF "))
    via, _ = parse_nccl_transports(text)
    return {s["bytes"]: s["busbw_gbps"] for s in data["sizes"]} | {"transports": via}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sizes", help="message sizes in bytes, comma separated")
    p.add_argument("--tandem", help="tandem command line (default: python -m tandem.cli)")
    opts = p.parse_args()
    opts.tandem_cmd = (
        shlex.split(opts.tandem) if opts.tandem else [sys.executable, "-m", "tandem.cli"]
    )
    opts.out.mkdir(parents=True, exist_ok=True)
    if opts.sizes:
        SIZES[:] = [int(x) for x in opts.sizes.split(",")]
    runs: dict[str, list[dict]] = {"tandem": [], "torch": []}
    for i in range(opts.rounds):
        order = ["tandem", "torch"] if i % 2 == 0 else ["torch", "tandem"]
        for who in order:
            t = time.monotonic()
            out = opts.out / f"{who}-r{i}.txt"
            got = tandem_round(opts, out) if who == "tandem" else reference_round(opts, out)
            runs[who].append(got)
            peak = max(v for k, v in got.items() if isinstance(k, int))
            print(
                f"round {i} {who:6s} peak busbw {peak:.3f} GB/s via {got['transports']} "
                f"({time.monotonic() - t:.0f} s)",
                flush=True,
            )
    print("\n| bytes | tandem busbw GB/s | torch busbw GB/s | tandem / torch |")
    print("|---:|---:|---:|---:|")
    for size in SIZES:
        ours = statistics.median(r[size] for r in runs["tandem"])
        ref = statistics.median(r[size] for r in runs["torch"])
        print(f"| {size:,} | {ours:.3f} | {ref:.3f} | {ours / ref:.3f} |")
    peaks = {
        who: statistics.median(max(v for k, v in r.items() if isinstance(k, int)) for r in rs)
        for who, rs in runs.items()
    }
    print(
        f"peak bus bandwidth (median of {opts.rounds} rounds): tandem {peaks['tandem']:.3f}, "
        f"torch {peaks['torch']:.3f} GB/s, ratio {peaks['tandem'] / peaks['torch']:.3f} "
        f"(goal >= 0.95); NCCL network: {runs['tandem'][0]['network']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
