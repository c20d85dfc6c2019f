"""One rank of tandem's fabric test: all-reduce bus bandwidth over sizes, and small-message latency.

Started once per rank by ``tandem.check.fabric`` (or shipped to a node as ``python3 - ...``),
with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set and the
rest of the deployment's environment as is. Imports only torch and the standard library.

Method (nccl-tests' definitions): for each message size, a few warm-up all-reduces, then
``iters`` back-to-back all-reduces between two barriers; the time per all-reduce is the slowest
rank's. ``algbw = bytes / time``; ``busbw = algbw * 2 (n - 1) / n``, the figure comparable with
the link's bandwidth whatever the rank count. Small-message latency is the time per all-reduce
of 8 bytes. Rank 0 prints one line ``TANDEM_FABRIC {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

LATENCY_BYTES = 8


def _sizes(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(tensor: torch.Tensor, iters: int, warmup: int, device: torch.device) -> float:
    """Seconds per all-reduce of ``tensor``, the slowest rank's."""
    for _ in range(warmup):
        dist.all_reduce(tensor)
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    _sync(device)
    elapsed = torch.tensor(
        [(time.perf_counter() - start) / iters], dtype=torch.float64, device=device
    )
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    parser.add_argument("--sizes", default="", help="message sizes in bytes, comma separated")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--latency-iters", type=int, default=100)
    parser.add_argument("--timeout-s", type=float, default=120)
    args = parser.parse_args(argv)

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    began = time.perf_counter()
    # device_id only for NCCL: a torch without the argument still runs the gloo test.
    init: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(
        backend,
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=args.timeout_s),
        **init,
    )
    rendezvous_s = time.perf_counter() - began

    check = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(check)
    expected = world * (world + 1) / 2
    correct = bool(torch.all(check == expected).item())

    default = [1 << k for k in range(10, 29 if backend == "nccl" else 25, 2)]  # to 256 / 16 MiB
    results = []
    for size in _sizes(args.sizes) or default:
        tensor = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        nbytes = tensor.numel() * 4
        iters = args.iters if nbytes <= (1 << 22) else max(3, args.iters // 4)
        seconds = _timed(tensor, iters, warmup=2, device=device)
        algbw = nbytes / seconds / 1e9
        results.append(
            {
                "bytes": nbytes,
                "iters": iters,
                "time_us": round(seconds * 1e6, 2),
                "algbw_gbps": round(algbw, 6),
                "busbw_gbps": round(algbw * 2 * (world - 1) / world, 6),
            }
        )
    small = torch.zeros(LATENCY_BYTES // 4, dtype=torch.float32, device=device)
    latency_s = _timed(small, args.latency_iters, warmup=5, device=device)

    if rank == 0:
        print(
            "TANDEM_FABRIC "
            + json.dumps(
                {
                    "backend": backend,
                    "world_size": world,
                    "device": str(device),
                    "torch_version": torch.__version__,
                    "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))
                    if backend == "nccl"
                    else None,
                    "correct": correct,
                    "rendezvous_s": round(rendezvous_s, 3),
                    "sizes": results,
                    "small_message_bytes": LATENCY_BYTES,
                    "small_message_latency_us": round(latency_s * 1e6, 2),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()
    return 0 if correct else 3


if __name__ == "__main__":
    sys.exit(main())
