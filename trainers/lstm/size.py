"""The per-symbol LSTMs for the planner: many small independent models, `--jobs-per-gpu` of them on
each GPU at once. Counted on the real model (it is small) on the CPU: parameters, FLOPs per sample,
and the bytes autograd saves per sample (trainers.ops.plan.saved_bytes_per_item)."""

from __future__ import annotations

from trainers.lstm.config import LstmConfig, n_features
from trainers.ops.plan import Workload, forward_flops, saved_bytes_per_item

DEFAULT_SYMBOLS = 3  # the seed's BTC-USD, ETH-USD, SOL-USD when none are named
SMALL_STEP_S = 0.003  # an eager step of a small model on a GPU: launches and Python, not FLOPs (assumed)
# A symbol's own run outside its steps (folder and lock, evaluations and checkpoints, the final evaluation
# and baselines, results): on the H100 (bench/results/gpu_h100/lstm_cohort_h100.json, 21fae23) 500 symbols
# one at a time took 127.4 s of job time, 0.255 s a symbol, of which its 30 steps at SMALL_STEP_S are 0.09 s.
SYMBOL_RUN_S = 0.165


def workload(cfg: LstmConfig) -> Workload:
    import torch

    from trainers.lstm.build import build_model

    model = build_model(cfg).train()
    n_in = model.lstm.input_size
    per_sample = saved_bytes_per_item(model, lambda b: (torch.randn(b, cfg.window, n_in),))
    flops = 3 * forward_flops(model, (torch.randn(1, cfg.window, n_in),))
    parameters = sum(p.numel() for p in model.parameters())
    symbols = (len(cfg.symbols.split(",")) if cfg.symbols else cfg.synthetic_tickers if cfg.source == "synthetic"
               else DEFAULT_SYMBOLS)
    days = cfg.synthetic_days if cfg.source == "synthetic" else int((cfg.years or 10) * 365)
    samples = int(days * (1 - cfg.val_frac - cfg.test_frac)) * symbols * cfg.epochs
    k = max(1, cfg.jobs_per_gpu or 1)
    return Workload(
        trainer="lstm", parameters=parameters, n_blocks=1, block_parameters=parameters, unit="samples",
        items_per_micro=cfg.batch_size, grad_accum=1, flops_per_item=flops,
        activation_bytes=lambda micro, _ck: int(per_sample * micro), kind="small", strategies=("ddp",),
        items_total=float(samples), jobs_per_gpu=k, independent=True, min_step_s=SMALL_STEP_S,
        outside_steps_s=symbols * SYMBOL_RUN_S,
        shape={"hidden": cfg.hidden, "layers": cfg.layers, "window": cfg.window, "symbols": symbols},
        notes=[f"{symbols} independent models, {k} at a time per GPU (no gradient traffic between them); about "
               f"{samples:,} samples in all (window {cfg.window}, {cfg.epochs} epochs); {SYMBOL_RUN_S} s a symbol "
               f"outside its steps (measured one symbol at a time on an H100; cohorts are not modelled)"])


MAX_AUTO_COHORT = 256  # past this a step's kernels are already wide; more only delays each symbol's first result
COHORT_MEMORY_SHARE = 0.5  # of the GPU's memory, for the cohort's saved activations (the rest: data, workers)


def cohort_size(cfg: LstmConfig, timeframes: list, device) -> int:
    """Symbols a worker trains at once (`--cohort`): the user's number, else 1 on a CPU (a stacked step
    is no faster there: tests/lstm/lstm_cohort_cpu.json) and on a GPU as many cohort members as half its
    memory holds for their activations (shared by the workers on it), at most MAX_AUTO_COHORT."""
    from trainers.runtime import device as device_mod

    if cfg.cohort is not None:
        return cfg.cohort
    total = device_mod.total_memory(device)
    if not total:  # a CPU
        return 1
    per_member = cfg.batch_size * stacked_saved_bytes_per_sample(cfg, n_features(len(timeframes)))
    fits = int(total * COHORT_MEMORY_SHARE / max(1, cfg.jobs_per_gpu) // max(per_member, 1.0))
    return max(1, min(MAX_AUTO_COHORT, fits))


def stacked_saved_bytes_per_sample(cfg: LstmConfig, features: int) -> float:
    """Bytes autograd saves per sample of one cohort member (measured on a stack of one, on the CPU)."""
    import torch

    from trainers.lstm.stacked import StackedLSTM

    model = StackedLSTM(1, features, cfg.hidden, cfg.layers, cfg.dropout).train()
    return saved_bytes_per_item(model, lambda b: (torch.randn(1, b, cfg.window, features),))
