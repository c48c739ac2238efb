"""Benchmark: forecaster training throughput, the kit's pipeline vs the naive one, same run.

    python bench/train_throughput.py --presets tiny --steps 30 --out bench/results/train_cpu.json
    python bench/train_throughput.py --presets small,151m --compile --out bench/results/train_h100.json  # GPU

For each preset: samples/s, step time (p50), peak memory and MFU (GPU only) of the kit's step
(trainers.forecast.train.forward_backward + optimizer_step: windows gathered by index from the
on-device store, SDPA, fused AdamW on CUDA, bf16 autocast, optional torch.compile), then the same
for the naive pipeline (bench/naive_forecaster.py), and their ratio. A second, synchronised pass
splits the kit's step into data / forward+backward / optimizer time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from naive_forecaster import NaiveForecaster, WindowDataset, naive_loader  # noqa: E402
from record import write_record  # noqa: E402

from trainers.forecast.config import PRESETS  # noqa: E402
from trainers.forecast.data import build_store  # noqa: E402
from trainers.forecast.model import Forecaster, TrainStep, count_parameters, flops_per_sample  # noqa: E402
from trainers.forecast.train import forward_backward, optimizer_step  # noqa: E402
from trainers.market.panel import to_panel  # noqa: E402
from trainers.market.synthetic import synthetic_market  # noqa: E402
from trainers.market.windows import FEATURES  # noqa: E402
from trainers.runtime.flops import mfu, peak_tflops  # noqa: E402
from trainers.runtime.info import device_name  # noqa: E402
from trainers.runtime.precision import (  # noqa: E402
    autocast,
    build_adamw,
    enable_tf32,
    make_grad_scaler,
    maybe_compile,
    precision_for,
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _timed(step, steps: int, warmup: int, device: torch.device, batch: int) -> dict:
    for _ in range(warmup):
        step()
    _sync(device)
    _reset_peak(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    total = sum(times)
    return {"samples_per_s": batch * steps / total, "step_time_p50_s": float(np.median(times)),
            "steps": steps, "peak_memory_bytes": _peak(device)}


def bench_ours(store, preset: str, batch: int, device, precision, compile_: bool, steps: int, warmup: int) -> dict:
    torch.manual_seed(0)
    model = Forecaster(**vars(PRESETS[preset]), n_features=len(FEATURES), window=store.window).to(device)
    train_step = maybe_compile(TrainStep(model), compile_)
    optimizer = build_adamw(model, 3e-4, 0.1, (0.9, 0.95), device)
    scaler = make_grad_scaler(device, precision)
    ids = store.sample_ids["train"]
    g = torch.Generator(device="cpu").manual_seed(0)
    weight = torch.ones(batch, device=device)
    scale = torch.tensor(1.0 / batch, device=device)

    def step(phases: dict | None = None):
        t0 = time.perf_counter()
        batch_ids = ids[torch.randint(len(ids), (batch,), generator=g).to(device)]
        if phases is not None:
            _sync(device)
            t1 = time.perf_counter()
        float(forward_backward(train_step, store, batch_ids, weight, device, precision, scaler, scale))
        if phases is not None:
            _sync(device)
            t2 = time.perf_counter()
        optimizer_step(model, optimizer, scaler, 1.0)
        if phases is not None:
            _sync(device)
            t3 = time.perf_counter()
            for key, dt in (("data", t1 - t0), ("forward_backward", t2 - t1), ("optimizer", t3 - t2)):
                phases[key] = phases.get(key, 0.0) + dt

    result = _timed(step, steps, warmup, device, batch)
    phases: dict = {}
    for _ in range(max(5, steps // 3)):
        step(phases)
    total = sum(phases.values())
    result["time_share"] = {k: round(v / total, 4) for k, v in phases.items()}
    result["parameters"] = count_parameters(model)
    return result


def bench_naive(store, preset: str, batch: int, device, precision, steps: int, warmup: int, workers: int) -> dict:
    torch.manual_seed(0)
    shape = PRESETS[preset]
    model = NaiveForecaster(shape.d_model, shape.n_layers, shape.n_heads, shape.d_ff, len(FEATURES),
                            store.window).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    features = store.features.cpu().numpy()
    target = ((store.target - store.target_mean) / store.target_std).cpu().numpy()
    dataset = WindowDataset(features, target, store.sample_ids["train"].cpu().numpy(), store.window, store.n_tickers)
    loader = naive_loader(dataset, batch, workers, device.type == "cuda")
    it = iter(loader)

    def step():
        nonlocal it
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, precision):
            pred = model(x)
        loss = ((pred.float() - y) ** 2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        float(loss.detach())

    result = _timed(step, steps, warmup, device, batch)
    result["parameters"] = count_parameters(model)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile the kit's model")
    p.add_argument("--workers", type=int, default=2, help="naive DataLoader workers")
    p.add_argument("--tickers", type=int, default=100)
    p.add_argument("--days", type=int, default=2520)
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = precision_for(device)
    tf32 = enable_tf32(device)
    store = build_store(to_panel(synthetic_market(args.tickers, args.days, seed=0)), 120, 20).to(device)
    name = device_name(device)
    results = []
    for preset in args.presets.split(","):
        shape = PRESETS[preset]
        flops = flops_per_sample(120, len(FEATURES), shape.d_model, shape.n_layers, shape.d_ff)
        ours = bench_ours(store, preset, args.batch, device, precision, args.compile, args.steps, args.warmup)
        ours["mfu"] = mfu(ours["samples_per_s"], flops, name)
        row = {"preset": preset, "batch": args.batch, "train_flops_per_sample": flops, "ours": ours}
        if not args.skip_naive:
            naive = bench_naive(store, preset, args.batch, device, precision, args.steps, args.warmup, args.workers)
            naive["mfu"] = mfu(naive["samples_per_s"], flops, name)
            row["naive"] = naive
            row["speedup"] = ours["samples_per_s"] / naive["samples_per_s"]
        results.append(row)
        print(json.dumps(row), flush=True)
    record = {"benchmark": "train_throughput", "device": name, "device_type": device.type,
              "peak_tflops": peak_tflops(name), "precision": precision.name, "tf32": tf32, "compile": args.compile,
              "threads": torch.get_num_threads(), "results": results}
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
