"""Benchmark: forecaster training throughput, the kit beside what users would pick instead, in one run.

    python bench/train_throughput.py --presets tiny --steps 30 --out bench/results/train_cpu.json
    python bench/train_throughput.py --presets small,base,151m --compile --out bench/results/train_gpu.json  # GPU

The same model (the kit's Forecaster), batch, precision and compile setting (eager vs eager,
compiled vs compiled) for:

    kit        the kit's own step: TrainStep (model + loss, one module) via forward_backward and
               optimizer_step, windows gathered on the device by index, fused AdamW on CUDA
               (and with --gpu-defaults on a CPU)
    plain      a well-written plain PyTorch loop: a DataLoader (workers, pinned memory) over the
               same in-memory arrays, fused AdamW on CUDA, the same autocast
    lightning  PyTorch Lightning (the framework seed 000 used): bf16-mixed on a GPU, 32-true on
               the CPU, the same module and DataLoader, AdamW not fused (Lightning refuses gradient
               clipping with a fused optimizer: on the H200 every preset failed so), skipped when
               lightning is not installed (a benchmark dependency: `pip install lightning`)
    naive      the seed-000 pipeline as it was written (historical reference, not like for like:
               nn.TransformerEncoder with attention-probability dropout, AdamW defaults)

Reported per peer: steady-state samples/s (after warm-up, device-synchronised around the timed
steps), effective samples/s (every sample trained ÷ the wall time from building the model to the
last step, setup and DataLoader start-up included) and MFU on GPUs with a known peak.
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

from naive_forecaster import NaiveForecaster, WindowDataset, naive_loader  # noqa: E402
from record import write_record  # noqa: E402

from trainers.forecast.config import PRESETS  # noqa: E402
from trainers.forecast.data import build_store  # noqa: E402
from trainers.forecast.model import Forecaster, TrainStep, count_parameters, flops_per_sample  # noqa: E402
from trainers.forecast.train import forward_backward, optimizer_step  # noqa: E402
from trainers.market.panel import to_panel  # noqa: E402
from trainers.market.synthetic import synthetic_market  # noqa: E402
from trainers.market.windows import FEATURES  # noqa: E402
from trainers.runtime.dist import pick_device  # noqa: E402
from trainers.runtime.flops import mfu, peak_tflops  # noqa: E402
from trainers.runtime.info import device_name  # noqa: E402
from trainers.runtime.precision import (  # noqa: E402
    autocast,
    build_adamw,
    enable_tf32,
    make_grad_scaler,
    precision_for,
    use_fused_adamw,
)

LR, WEIGHT_DECAY, BETAS = 3e-4, 0.1, (0.9, 0.95)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def _timed(step, steps: int, warmup: int, device: torch.device, batch: int, started: float) -> dict:
    """Warm-up steps, then `steps` timed as one synchronised window (not per-step wall times)."""
    for _ in range(warmup):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    seconds = time.perf_counter() - t0
    wall = time.perf_counter() - started
    return {"samples_per_s": batch * steps / seconds, "step_time_s": seconds / steps, "steps": steps,
            "effective_samples_per_s": batch * (steps + warmup) / wall, "wall_s": wall,
            "peak_memory_bytes": _peak(device)}


def forecaster(preset: str, window: int, device: torch.device) -> Forecaster:
    torch.manual_seed(0)
    return Forecaster(**vars(PRESETS[preset]), n_features=len(FEATURES), window=window).to(device)


def loader_over_store(store, batch: int, workers: int, device: torch.device):
    features = store.features.cpu().numpy()
    target = ((store.target - store.target_mean) / store.target_std).cpu().numpy()
    dataset = WindowDataset(features, target, store.sample_ids["train"].cpu().numpy(), store.window, store.n_tickers)
    return naive_loader(dataset, batch, workers, device.type == "cuda")


def endless(loader):
    while True:
        yield from loader


def compiled(model: torch.nn.Module, compile_: bool) -> torch.nn.Module:
    """torch.compile itself, not the trainers' maybe_compile: a benchmark that asks for a compiled step measures
    one or fails (the trainers fall back to eager on a compile failure), and Lightning needs a module."""
    return torch.compile(model) if compile_ else model


def bench_kit(store, preset, batch, device, precision, compile_, steps, warmup, gpu_defaults, **_) -> dict:
    started = time.perf_counter()
    model = forecaster(preset, store.window, device)
    train_step = compiled(TrainStep(model), compile_)
    optimizer = build_adamw(model, LR, WEIGHT_DECAY, BETAS, device, gpu_defaults)
    scaler = make_grad_scaler(device, precision)
    ids = store.sample_ids["train"]
    g = torch.Generator(device="cpu").manual_seed(0)
    weight = torch.ones(batch, device=device)
    scale = torch.tensor(1.0 / batch, device=device)

    def step():
        batch_ids = ids[torch.randint(len(ids), (batch,), generator=g).to(device)]
        forward_backward(train_step, store, batch_ids, weight, device, precision, scaler, scale)
        optimizer_step(model, optimizer, scaler, 1.0)

    result = _timed(step, steps, warmup, device, batch, started)
    result["parameters"] = count_parameters(model)
    result["fused_adamw"] = use_fused_adamw(device, gpu_defaults)
    return result


def bench_plain(store, preset, batch, device, precision, compile_, steps, warmup, workers, gpu_defaults,
                **_) -> dict:
    started = time.perf_counter()
    model = forecaster(preset, store.window, device)
    train_model = compiled(model, compile_)
    optimizer = build_adamw(model, LR, WEIGHT_DECAY, BETAS, device, gpu_defaults)
    scaler = make_grad_scaler(device, precision)
    batches = endless(loader_over_store(store, batch, workers, device))

    def step():
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, precision):
            pred = train_model(x)
        loss = ((pred.float() - y) ** 2).mean()
        scaler.scale(loss).backward()
        optimizer_step(model, optimizer, scaler, 1.0)

    result = _timed(step, steps, warmup, device, batch, started)
    result["parameters"] = count_parameters(model)
    return result


def bench_lightning(store, preset, batch, device, precision, compile_, steps, warmup, workers, **_) -> dict:
    try:
        import lightning as L
    except ImportError:
        return {"skipped": "lightning is not installed (a benchmark-only dependency: pip install lightning)"}
    started = time.perf_counter()
    model = forecaster(preset, store.window, torch.device("cpu"))

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = compiled(model, compile_)

        def training_step(self, batch_, _index):
            x, y = batch_
            return ((self.model(x).float() - y) ** 2).mean()

        def configure_optimizers(self):  # not fused: Lightning refuses gradient clipping with a fused AdamW
            decay = [p for p in model.parameters() if p.dim() >= 2]  # (every preset failed so on the H200)
            rest = [p for p in model.parameters() if p.dim() < 2]
            return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                      {"params": rest, "weight_decay": 0.0}], lr=LR, betas=BETAS, fused=False)

    marks: dict = {}

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer, module, batch_, index):
            if index == warmup:
                _sync(device)
                marks["t0"] = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch_, index):
            if index == warmup + steps - 1:
                _sync(device)
                marks["t1"] = time.perf_counter()

    lightning_precision = {"bf16": "bf16-mixed", "fp16": "16-mixed"}.get(precision.name, "32-true")
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_steps=warmup + steps,
                        precision=lightning_precision, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                        callbacks=[Clock()], num_sanity_val_steps=0)
    trainer.fit(Module(), train_dataloaders=loader_over_store(store, batch, workers, device))
    wall = time.perf_counter() - started
    seconds = marks["t1"] - marks["t0"]
    return {"samples_per_s": batch * steps / seconds, "step_time_s": seconds / steps, "steps": steps,
            "effective_samples_per_s": batch * (steps + warmup) / wall, "wall_s": wall,
            "peak_memory_bytes": _peak(device), "parameters": count_parameters(model),
            "precision": lightning_precision, "lightning": L.__version__, "fused_adamw": False}


def bench_naive(store, preset, batch, device, precision, steps, warmup, workers, **_) -> dict:
    started = time.perf_counter()
    torch.manual_seed(0)
    shape = PRESETS[preset]
    model = NaiveForecaster(shape.d_model, shape.n_layers, shape.n_heads, shape.d_ff, len(FEATURES),
                            store.window).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    batches = endless(loader_over_store(store, batch, workers, device))

    def step():
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, precision):
            pred = model(x)
        loss = ((pred.float() - y) ** 2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()

    result = _timed(step, steps, warmup, device, batch, started)
    result["parameters"] = count_parameters(model)
    result["note"] = "historical reference: a different module (attention dropout), not like for like"
    return result


PEERS = {"kit": bench_kit, "plain": bench_plain, "lightning": bench_lightning, "naive": bench_naive}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny")
    p.add_argument("--peers", default=",".join(PEERS), help=f"which of {', '.join(PEERS)} (default: all)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile every peer but the naive one")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers of the plain, Lightning and naive peers")
    p.add_argument("--tickers", type=int, default=100)
    p.add_argument("--days", type=int, default=2520)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: the GPU when there is one (cpu: the dry run of make bench-gpu, even on a GPU machine)")
    p.add_argument("--gpu-defaults", action="store_true",
                   help="on a CPU, what the GPU run uses: bf16 autocast and fused AdamW for the kit and the plain "
                        "loop (the dry run of make bench-gpu: a peer that refuses the GPU's settings fails there)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    peers = [name for name in args.peers.split(",") if name]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        p.error(f"--peers: unknown {unknown}; choose from {', '.join(PEERS)}")

    device = pick_device(0, args.device)  # auto: the kit's own choice (and the tests' fake accelerator's)
    precision = precision_for(device, rehearse=args.gpu_defaults)
    tf32 = enable_tf32(device)
    store = build_store(to_panel(synthetic_market(args.tickers, args.days, seed=0)), 120, 20).to(device)
    name = device_name(device)
    # "trainer": `trainers plan` reads every train_gpu*.json for a measured MFU; a record without the key
    # would lend the forecaster's MFU to every trainer's plan
    record = {"benchmark": "train_throughput", "trainer": "forecast", "device": name, "device_type": device.type,
              "peak_tflops": peak_tflops(name), "precision": precision.name, "tf32": tf32, "compile": args.compile,
              "threads": torch.get_num_threads(), "gpu_defaults": args.gpu_defaults, "complete": False, "results": []}
    results = record["results"]
    for preset in args.presets.split(","):
        shape = PRESETS[preset]
        flops = flops_per_sample(120, len(FEATURES), shape.d_model, shape.n_layers, shape.d_ff)
        row = {"preset": preset, "batch": args.batch, "train_flops_per_sample": flops}
        for peer in peers:
            try:
                r = PEERS[peer](store, preset, args.batch, device, precision, compile_=args.compile, steps=args.steps,
                                warmup=args.warmup, workers=args.workers, gpu_defaults=args.gpu_defaults)
            except Exception as exc:  # noqa: BLE001 - one peer failing (a framework's version, memory) leaves the rest
                r = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                print(f"{preset} {peer}: {r['error']}", file=sys.stderr, flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            if "samples_per_s" in r:
                r["mfu"] = mfu(r["samples_per_s"], flops, name)
                r["effective_mfu"] = mfu(r["effective_samples_per_s"], flops, name)
            row[peer] = r
        if "kit" in row:
            row["kit_over"] = {peer: row["kit"]["samples_per_s"] / row[peer]["samples_per_s"]
                               for peer in peers if peer != "kit" and "samples_per_s" in row[peer]}
        results.append(row)
        print(json.dumps(row), flush=True)
        write_record(record, args.out)  # after every preset: a run stopped by its timeout keeps what it measured
    record["complete"] = True
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
