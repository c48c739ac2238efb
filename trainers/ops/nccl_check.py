"""All-reduce bandwidth across the local devices; run under torchrun (preflight does).

busbw = algbw * 2(n-1)/n, as nccl-tests report it: comparable across GPU counts.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from trainers.runtime.device import synchronize
from trainers.runtime.dist import distributed


def bus_bandwidth_gbps(nbytes: int, seconds: float, world: int) -> float:
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--sizes-mb", default="8,64,256")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with distributed("cpu" if args.backend == "gloo" else "auto", timeout_s=120) as ctx:
        results = []
        for mb in [int(s) for s in args.sizes_mb.split(",")]:
            x = torch.ones(mb * (1 << 20) // 4, dtype=torch.float32, device=ctx.device)
            for _ in range(2):  # warm up the communicator
                dist.all_reduce(x)
            synchronize(ctx.device)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(x)
            synchronize(ctx.device)
            dt = (time.perf_counter() - t0) / args.iters
            results.append({"mb": mb, "seconds": dt, "busbw_gbps": bus_bandwidth_gbps(x.numel() * 4, dt, ctx.world_size)})
        if ctx.is_main:
            with open(args.out, "w") as f:
                json.dump({"backend": args.backend, "world_size": ctx.world_size, "sizes": results}, f)
    return 0


if __name__ == "__main__":
    from trainers.runtime.leave import leave

    leave(main())  # a torchrun worker: ends like every trainer's (runtime/leave.py)
