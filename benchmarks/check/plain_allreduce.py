"""A plain torch.distributed all-reduce benchmark, independent of tandem, for comparison.

Run with torchrun, one process per GPU:
    torchrun --nproc-per-node 2 benchmarks/check/plain_allreduce.py

Same definitions as nccl-tests and `tandem check --fabric`: busbw = bytes / time x 2(n-1)/n;
time = the slowest rank's mean over back-to-back all-reduces after warm-up; latency = 8 bytes.
"""

import json
import os
import time

import torch
import torch.distributed as dist


def timed(tensor, iters, warmup):
    for _ in range(warmup):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    elapsed = torch.tensor(
        [(time.perf_counter() - start) / iters], device="cuda", dtype=torch.float64
    )
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for k in range(10, 29, 2):
        tensor = torch.zeros((1 << k) // 4, device="cuda")
        iters = 20 if (1 << k) <= (1 << 22) else 5
        seconds = timed(tensor, iters, 2)
        algbw = (1 << k) / seconds / 1e9
        rows.append(
            {
                "bytes": 1 << k,
                "time_us": round(seconds * 1e6, 2),
                "busbw_gbps": round(algbw * 2 * (world - 1) / world, 3),
            }
        )
    latency = timed(torch.zeros(2, device="cuda"), 100, 5)
    if rank == 0:
        print(
            "PLAIN_ALLREDUCE "
            + json.dumps(
                {
                    "world_size": world,
                    "sizes": rows,
                    "small_message_latency_us": round(latency * 1e6, 2),
                    "peak_busbw_gbps": max(r["busbw_gbps"] for r in rows),
                }
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
