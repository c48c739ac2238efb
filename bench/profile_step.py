"""Where the training step's time goes: torch.profiler over the kit's step and the naive model.

    python bench/profile_step.py [--preset tiny] [--steps 3]
    python bench/profile_step.py --preset 151m --steps 5 --out bench/results/profile_gpu.json   # GPU

Prints the top operators by self CPU time (device time on a GPU) for both, and the ratio of their
total model time; --out also writes them as JSON (each operator's share of the profiled self time).
The README quotes its output.
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

from naive_forecaster import NaiveForecaster  # noqa: E402
from record import write_record  # noqa: E402

from trainers.forecast.config import PRESETS  # noqa: E402
from trainers.forecast.data import build_store  # noqa: E402
from trainers.forecast.model import Forecaster, TrainStep  # noqa: E402
from trainers.forecast.train import forward_backward, optimizer_step  # noqa: E402
from trainers.market.panel import to_panel  # noqa: E402
from trainers.market.synthetic import synthetic_market  # noqa: E402
from trainers.market.windows import FEATURES  # noqa: E402
from trainers.runtime.dist import pick_device  # noqa: E402
from trainers.runtime.info import device_name  # noqa: E402
from trainers.runtime.precision import (  # noqa: E402
    autocast,
    build_adamw,
    make_grad_scaler,
    precision_for,
)

TOP = 8


def profile(step, steps: int, device: torch.device, label: str) -> dict:
    for _ in range(2):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    t0 = time.perf_counter()
    with torch.profiler.profile() as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(f"== {label}: {elapsed:.3f} s for {steps} steps")
    averages = prof.key_averages()
    print(averages.table(sort_by=sort, row_limit=TOP))
    times = [(e.key, getattr(e, sort) / 1e6, e.count) for e in averages]  # microseconds -> seconds
    total = sum(t for _, t, _ in times) or 1e-12
    top = sorted(times, key=lambda x: -x[1])[:TOP]
    return {"seconds": elapsed, "step_s": elapsed / steps, "timed_by": sort, "profiled_self_s": total,
            "top": [{"op": k, "self_s": t, "share": t / total, "calls": c} for k, t, c in top]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: the GPU when there is one (cpu: the dry run of make bench-gpu, even on a GPU machine)")
    p.add_argument("--out", default=None, help="also write the top operators and times as JSON here")
    args = p.parse_args()
    device = pick_device(0, args.device)  # auto: the kit's own choice (and the tests' fake accelerator's)
    precision = precision_for(device)
    store = build_store(to_panel(synthetic_market(20, 1500, seed=0)), 120, 20).to(device)
    ids = store.sample_ids["train"][: args.batch]
    shape = PRESETS[args.preset]

    model = Forecaster(**vars(shape), n_features=len(FEATURES), window=120).to(device)
    step = TrainStep(model)
    opt = build_adamw(model, 3e-4, 0.1, (0.9, 0.95), device)
    scaler = make_grad_scaler(device, precision)
    weight, scale = torch.ones(len(ids), device=device), torch.tensor(1.0 / len(ids), device=device)

    def ours():
        forward_backward(step, store, ids, weight, device, precision, scaler, scale)
        optimizer_step(model, opt, scaler, 1.0)

    naive = NaiveForecaster(shape.d_model, shape.n_layers, shape.n_heads, shape.d_ff, len(FEATURES), 120).to(device)
    naive_opt = torch.optim.AdamW(naive.parameters())
    x, y = store.gather(ids)

    def reference():
        with autocast(device, precision):
            loss = ((naive(x).float() - y) ** 2).mean()
        loss.backward()
        naive_opt.step()
        naive_opt.zero_grad()

    a = profile(ours, args.steps, device, "kit step")
    b = profile(reference, args.steps, device, "naive model step (data already in memory)")
    print(f"naive model / kit step time: {b['seconds'] / a['seconds']:.2f}x")
    write_record({"benchmark": "profile_step", "device": device_name(device), "preset": args.preset,
                  "batch": len(ids), "steps": args.steps, "precision": precision.name, "kit": a, "naive": b,
                  "naive_over_kit": b["seconds"] / a["seconds"]}, args.out)
    if args.out:
        print(json.dumps({"kit_top": [x["op"] for x in a["top"][:3]], "naive_over_kit": b["seconds"] / a["seconds"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
