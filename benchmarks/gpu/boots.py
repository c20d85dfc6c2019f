#!/usr/bin/env python3
"""Boot CUDA vLLM once per (shape, gpu_memory_utilization, eager|graph, TP) and keep the logs.

Run on the GPU machine after the kit's staging (``../shared/gpu/README.md``), from the repo root,
with the kit's environment sourced. Each boot is a plain ``vllm serve`` (TP 2: two ranks in
vLLM's multi-node mp mode, each in its own network namespace with its own ``NCCL_HOSTID``; on a
one-GPU machine both ranks share GPU 0, so one GPU stands in for two nodes). A boot is stopped
as soon as the leader logged ``Maximum concurrency`` (the KV cache is sized then), unless
``--full`` asks for the whole boot; the next starts once the GPU's memory is back to idle.

    python3 benchmarks/gpu/boots.py --out $OUT/boots --deadline 560 --state /root/boots \\
        llama-3.1-8b:0.90:eager:1 llama-3.1-8b:0.50:graph:1 ...

A boot already in ``--state`` is skipped, so a later call goes on where the deadline stopped an
earlier one. Each boot leaves ``<name>/rank*.log`` and one JSON line in ``boots.jsonl``.

A shape found in ``--shapes DIR/serve/<shape>`` (``shape_dirs.py``: config and tokenizer, no
weights) is served from there with ``--load-format dummy``, others from the HF cache (``REPOS``).
A spec may end in ``:max_model_len:max_num_seqs`` (default 8192 and 256); a TP written ``2ep``
adds ``--enable-expert-parallel`` (whole experts per rank, as seed 002 serves). With
``--probe``, each boot runs with ``TANDEM_PROBE_DIR`` set to its log folder (``vllm_probe.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

from tandem.agent import Node
from tandem.watch.gpu import parse_nvidia_smi

REPOS = {
    "llama-3.1-8b": "tandem-shapes/llama-3.1-8b",
    "deepseek-v2-lite": "tandem-shapes/deepseek-v2-lite-13l",
    "gemma-3-4b": "tandem-shapes/gemma-3-4b",
}
MAX_MODEL_LEN = 8192
MAX_NUM_SEQS = 256
DONE = re.compile(r"Maximum concurrency for [\d,]+ tokens per request")
READY = re.compile(r"Application startup complete")
FAILED = re.compile(r"(RuntimeError|ValueError|NCCL error|CUDA out of memory|Traceback)[^\n]*")
NS = {0: ("gpu-n0", "10.77.0.1", "tdm0"), 1: ("gpu-n1", "10.77.0.2", "tdm1")}


def dummy(shape: str, shapes: Path | None) -> bool:
    """Served from shape_dirs.py's folder (no weights) rather than the HF cache."""
    return shapes is not None and (shapes / "serve" / shape).is_dir()


def serve_args(
    shape: str,
    util: float,
    mode: str,
    tp: int,
    shapes: Path | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    max_num_seqs: int = MAX_NUM_SEQS,
    expert_parallel: bool = False,
) -> list[str]:
    model = str(shapes / "serve" / shape) if shapes and dummy(shape, shapes) else REPOS[shape]
    args = [
        "vllm",
        "serve",
        model,
        "--served-model-name",
        shape,
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--gpu-memory-utilization",
        str(util),
        "--generation-config",
        "vllm",
        "--tensor-parallel-size",
        str(tp),
    ]
    if dummy(shape, shapes):
        args += ["--load-format", "dummy"]
    if mode == "eager":
        args.append("--enforce-eager")
    if expert_parallel:
        args.append("--enable-expert-parallel")
    if tp > 1:
        args += [
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            str(tp),
            "--master-port",
            "29501",
            "--master-addr",
            NS[0][1],
            "--disable-custom-all-reduce",
        ]
    return args


def rank_command(args: list[str], rank: int, gpus: int) -> list[str]:
    """TP > 1: the rank's namespace, private /dev/shm, own NCCL_HOSTID and interfaces."""
    ns, ip, ifc = NS[rank]
    extra = ["--node-rank", str(rank)] + (
        ["--headless"] if rank else ["--host", "0.0.0.0", "--port", "8000"]
    )
    env = {
        "CUDA_VISIBLE_DEVICES": str(rank if gpus > 1 else 0),
        "NCCL_HOSTID": f"node{rank}",
        "VLLM_HOST_IP": ip,
        "GLOO_SOCKET_IFNAME": ifc,
        "NCCL_SOCKET_IFNAME": ifc,
        "TP_SOCKET_IFNAME": ifc,
    }
    inner = (
        "mount -t tmpfs -o size=16g tmpfs /dev/shm && exec env "
        + " ".join(f"{k}={v}" for k, v in env.items())
        + " "
        + shlex.join(args + extra)
    )
    return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "-m", "sh", "-c", inner]


def wait_idle(limit_s: float = 60.0) -> float:
    """Seconds until the GPU holds under 1 GiB again, read as `tandem watch` reads it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if (
            sum(g.memory_used_bytes or 0 for g in parse_nvidia_smi(Node().run("nvidia-smi-watch")))
            < 1 << 30
        ):
            break
        time.sleep(0.5)
    return time.monotonic() - t0


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    t0 = time.monotonic()
    while any(p.poll() is None for p in procs) and time.monotonic() - t0 < 20:
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def boot(
    spec: str,
    out: Path,
    gpus: int,
    full: bool,
    limit_s: float,
    shapes: Path | None = None,
    probe: bool = False,
) -> dict:
    shape, util, mode, tp, *lengths = spec.split(":")
    util_f, tp_i, ep = float(util), int(tp.removesuffix("ep")), tp.endswith("ep")
    max_model_len = int(lengths[0]) if lengths else MAX_MODEL_LEN
    max_num_seqs = int(lengths[1]) if len(lengths) > 1 else MAX_NUM_SEQS
    name = f"{shape}-u{util}-{mode}-tp{tp}"
    if lengths:
        name += f"-len{max_model_len}-seqs{max_num_seqs}"
    logdir = out / name
    logdir.mkdir(parents=True, exist_ok=True)
    args = serve_args(shape, util_f, mode, tp_i, shapes, max_model_len, max_num_seqs, ep)
    env = dict(os.environ, VLLM_LOGGING_LEVEL="DEBUG")
    if probe:
        env["TANDEM_PROBE_DIR"] = str(logdir)
    if tp_i == 1:
        env["CUDA_VISIBLE_DEVICES"] = "0"
        commands = {0: args}
    else:
        commands = {1: rank_command(args, 1, gpus), 0: rank_command(args, 0, gpus)}
    (logdir / "command.txt").write_text(
        "".join(f"rank{r}: {shlex.join(c)}\n" for r, c in commands.items())
    )
    procs, files = [], {}
    t0 = time.monotonic()
    wall0 = time.time()
    for rank, command in commands.items():  # rank 1 (headless) first, as tp2_test.sh does
        files[rank] = open(logdir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append(
            subprocess.Popen(
                command,
                stdout=files[rank],
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        if tp_i > 1 and rank == 1:
            time.sleep(2)
    target = READY if full else DONE
    status, seen_s = "timeout", None
    while time.monotonic() - t0 < limit_s:
        text = (logdir / "rank0.log").read_text(errors="replace")
        if target.search(text):
            status, seen_s = "ok", time.monotonic() - t0
            break
        if any(p.poll() is not None for p in procs):
            status = "exited"
            break
        time.sleep(0.25)
    stop(procs)
    for f in files.values():
        f.close()
    idle_s = wait_idle()
    text = (logdir / "rank0.log").read_text(errors="replace")
    error = None
    if status != "ok":
        found = FAILED.findall(text)
        match = FAILED.search(text)
        error = match.group(0) if match else f"{len(found)} errors"
    return {
        "boot": name,
        "shape": shape,
        "util": util_f,
        "mode": mode,
        "tp": tp_i,
        "expert_parallel": ep,
        "gpus": gpus,
        "status": status,
        "seconds_to_line": seen_s,
        "started": wall0,
        "idle_wait_s": round(idle_s, 1),
        "error": error,
        "repo_id": REPOS.get(shape, f"tandem-shapes/{shape}"),
        "load_format": "dummy" if dummy(shape, shapes) else "auto",
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True, help="kept between calls")
    parser.add_argument("--deadline", type=float, default=560, help="seconds for this call")
    parser.add_argument("--expect", type=float, default=75, help="seconds one boot needs")
    parser.add_argument("--limit", type=float, default=240, help="seconds one boot may take")
    parser.add_argument("--full", action="store_true", help="boot until the API is up")
    parser.add_argument("--shapes", type=Path, help="shape_dirs.py output (dummy-load shapes)")
    parser.add_argument("--probe", action="store_true", help="set TANDEM_PROBE_DIR per boot")
    parser.add_argument(
        "specs", nargs="+", help="shape:util:eager|graph:tp[ep][:max_model_len:max_num_seqs]"
    )
    opts = parser.parse_args()
    t0 = time.monotonic()
    opts.out.mkdir(parents=True, exist_ok=True)
    opts.state.mkdir(parents=True, exist_ok=True)
    gpus = int(
        subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU ")
    )
    done_file = opts.state / "boots.jsonl"
    done = set()
    if done_file.exists():
        done = {json.loads(line)["spec"] for line in done_file.read_text().splitlines()}
    for spec in opts.specs:
        if spec in done:
            continue
        left = opts.deadline - (time.monotonic() - t0)
        if left < opts.expect:
            print(f"DEFER {spec}: {left:.0f} s left", flush=True)
            continue
        result = boot(
            spec,
            opts.state / "logs",
            gpus,
            opts.full,
            min(opts.limit, left - 10),
            opts.shapes,
            opts.probe,
        )
        result["spec"] = spec
        print("BOOT " + json.dumps(result), flush=True)
        with done_file.open("a") as f:
            f.write(json.dumps(result) + "\n")
    subprocess.run(["cp", "-r", str(opts.state) + "/.", str(opts.out)])


if __name__ == "__main__":
    main()
