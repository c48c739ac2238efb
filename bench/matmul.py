"""The ceiling: what this device's matrix units and memory really do, for MFU and bandwidth to be
read against (a measured 8192^3 bf16 matmul reaches about 790-800 TFLOP/s on this workplace's
H100/H200; a device-to-device copy about 3.0 TB/s on an H100, 4.3 TB/s on an H200).

    python bench/matmul.py --out bench/results/matmul_gpu.json     # on a GPU
    python bench/matmul.py --size 1024 --dtype fp32                # on a CPU, for the harness

Timed with device events over repeated runs after warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.runtime.dist import pick_device  # noqa: E402
from trainers.runtime.flops import peak_tflops  # noqa: E402
from trainers.runtime.info import device_name  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def timed(fn, iters: int, device: torch.device) -> float:
    """Seconds per call: device events on CUDA, wall clock on the CPU."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--copy-mib", type=int, default=1024, help="device-to-device copy size")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: the GPU when there is one (cpu: the dry run of make bench-gpu, even on a GPU machine)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = pick_device(0, args.device)  # auto: the kit's own choice (and the tests' fake accelerator's)
    n, dtype = args.size, DTYPES[args.dtype]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = timed(lambda: a @ b, args.iters, device)
    tflops = 2 * n**3 / seconds / 1e12
    src = torch.empty(args.copy_mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), max(5, args.iters // 5), device)
    name = device_name(device)
    peak = peak_tflops(name)
    record = {"benchmark": "matmul", "device": name, "size": n, "dtype": args.dtype, "seconds": seconds,
              "tflops": tflops, "datasheet_peak_tflops": peak, "share_of_peak": tflops / peak if peak else None,
              "copy_bytes": src.numel(), "copy_gb_per_s": 2 * src.numel() / copy_s / 1e9}  # read + write
    write_record(record, args.out)
    print(json.dumps({k: record[k] for k in ("device", "tflops", "share_of_peak", "copy_gb_per_s")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
