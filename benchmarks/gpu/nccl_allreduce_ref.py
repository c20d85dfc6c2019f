"""A plain torch NCCL all-reduce, the reference for `tandem check --fabric` (one rank).

Written apart from tandem's fabric test (``tandem.check.allreduce``) on purpose: what a person
would run by hand, torch.distributed's ``env://`` rendezvous, CUDA events around ``iters``
back-to-back all-reduces after ``warmup`` ones, the slowest rank's time. Bus bandwidth as
nccl-tests defines it: ``bytes / time * 2 (n - 1) / n``. Rank 0 prints ``REF {json}``.
Without a GPU it runs Gloo on the CPU with a wall clock (to try the script anywhere).

Started by ``benchmarks/gpu/fabric_vs_torch.py`` in each node's namespace with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the node's NCCL variables.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", required=True, help="bytes, comma separated")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    rows = []
    for size in (int(s) for s in a.sizes.split(",")):
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        iters = a.iters if size <= (1 << 22) else max(5, a.iters // 4)
        for _ in range(a.warmup):
            dist.all_reduce(x)
        if gpu:
            torch.cuda.synchronize()
        dist.barrier()
        if gpu:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        wall = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if gpu:
            end.record()
            torch.cuda.synchronize()
            per = begin.elapsed_time(end) / 1000 / iters
        else:
            per = (time.perf_counter() - wall) / iters
        seconds = torch.tensor([per], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        t = float(seconds.item())
        rows.append(
            {
                "bytes": size,
                "iters": iters,
                "time_us": round(t * 1e6, 2),
                "busbw_gbps": round(size / t / 1e9 * 2 * (world - 1) / world, 6),
            }
        )
    if dist.get_rank() == 0:
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpu else None
        print("REF " + json.dumps({"world_size": world, "nccl": nccl, "sizes": rows}), flush=True)
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
