"""The per-symbol LSTMs for the planner: many small independent models, `--jobs-per-gpu` of them on
each GPU at once. Counted on the real model (it is small) on the CPU: parameters, FLOPs per sample,
and the bytes autograd saves per sample (trainers.ops.plan.saved_bytes_per_item)."""

from __future__ import annotations

import math

from trainers.lstm.config import LstmConfig, n_features
from trainers.ops.plan import Workload, forward_flops, saved_bytes_per_item

DEFAULT_SYMBOLS = 3  # the seed's BTC-USD, ETH-USD, SOL-USD when none are named
SMALL_STEP_S = 0.003  # an eager step of a small model on a GPU: launches and Python, not FLOPs (assumed)
# A symbol's own run outside its steps (folder and lock, evaluations and checkpoints, the final evaluation
# and baselines, results): on the H100 (bench/results/gpu_h100/lstm_cohort_h100.json, 21fae23) 500 symbols
# one at a time took 127.4 s of job time, 0.255 s a symbol, of which its 30 steps at SMALL_STEP_S are 0.09 s.
SYMBOL_RUN_S = 0.165
# In cohorts (--cohort, a GPU's default), from the H200's two cohort jobs of the default model, 5 epochs
# (bench/results/gpu_h200_aadb2aa/cohort_packing_gpu.json, aadb2aa; each job's time outside its steps is
# sum_symbol_s x share_outside_steps, its steps' the rest): 64 symbols in one cohort spent 10.31 s outside their
# steps, 500 in two (256 + 244) 47.38 s. A cohort's own part (its set-up, its first steps' warm-up, its end) and a
# member's solve 10.31 = c + 64 s and 47.38 = 2 c + 500 s: a fit of two runs, not an independent check. The
# jobs time their steps on the host, which does not wait for the device: the split between the steps and the
# rest is the jobs' records (the steps' device work the host waited for later counts outside), the sum is right.
COHORT_RUN_S = 5.70
COHORT_SYMBOL_RUN_S = 0.072
# The stacked step: the 500-symbol job's 60 stacked steps (2 cohorts x 30) took 10.12 s for 500 x 30 x 256
# samples, 2.6 us a sample of the default model (hidden 64, 2 layers, window 64, batch 256), scaled by FLOPs for
# another. Smaller cohorts use the card less well: the 64-symbol job's steps took 2.33 s, this rate says 1.3 s.
STACKED_SAMPLE_S = 10.117 / (500 * 30 * 256)
PLAN_GPU_MEMORY = 80 * 2**30  # the planner sizes --cohort's GPU default for an 80 GB card (256 from ~1 GB)


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
    members = planned_cohort(cfg, n_in, symbols)
    shape = {"hidden": cfg.hidden, "layers": cfg.layers, "window": cfg.window, "symbols": symbols, "cohort": members}
    if members == 1:
        return Workload(
            trainer="lstm", parameters=parameters, n_blocks=1, block_parameters=parameters, unit="samples",
            items_per_micro=cfg.batch_size, grad_accum=1, flops_per_item=flops,
            activation_bytes=lambda micro, _ck: int(per_sample * micro), kind="small", strategies=("ddp",),
            items_total=float(samples), jobs_per_gpu=k, independent=True, min_step_s=SMALL_STEP_S,
            outside_steps_s=symbols * SYMBOL_RUN_S, shape=shape,
            notes=[f"{symbols} independent models, {k} at a time per GPU (no gradient traffic between them); about "
                   f"{samples:,} samples in all (window {cfg.window}, {cfg.epochs} epochs); {SYMBOL_RUN_S} s a "
                   f"symbol outside its steps (measured one symbol at a time on an H100)"])
    # A cohort's step trains every member's batch at once; cohorts come out as even as the symbols allow
    stacked_per_sample = stacked_saved_bytes_per_sample(cfg, n_in)
    cohorts = math.ceil(symbols / members)
    per_step = cfg.batch_size * symbols / cohorts
    default_flops = 3 * forward_flops(build_model(LstmConfig()).train(), (torch.randn(1, LstmConfig().window, n_in),))
    stacked_step = max(SMALL_STEP_S, per_step * STACKED_SAMPLE_S * flops / default_flops)
    return Workload(
        trainer="lstm", parameters=parameters, n_blocks=1, block_parameters=parameters, unit="samples",
        items_per_micro=int(per_step), grad_accum=1, flops_per_item=flops,
        activation_bytes=lambda micro, _ck: int(stacked_per_sample * micro), kind="small", strategies=("ddp",),
        items_total=float(samples), jobs_per_gpu=k, independent=True, min_step_s=stacked_step,
        min_step_why="a stacked step's time per sample, measured in cohorts on an H200",
        outside_steps_s=cohorts * COHORT_RUN_S + symbols * COHORT_SYMBOL_RUN_S, shape=shape,
        notes=[f"{symbols} independent models in {cohorts} cohort(s) of up to {members} (--cohort), each cohort one "
               f"stacked model a step ({stacked_step * 1e3:.0f} ms, from the H200's {STACKED_SAMPLE_S * 1e6:.1f} us "
               f"a sample of the default model, scaled by FLOPs), {k} worker(s) per GPU; about {samples:,} samples "
               f"in all (window {cfg.window}, {cfg.epochs} epochs); outside the steps {COHORT_RUN_S} s a cohort and "
               f"{COHORT_SYMBOL_RUN_S} s a symbol (fitted to the H200's two cohort jobs; on several GPUs the "
               f"cohorts are counted as if one worker formed them all)"])


def planned_cohort(cfg: LstmConfig, features: int, symbols: int) -> int:
    """The cohort a GPU job forms: --cohort, else what cohort_size gives an 80 GB card (PLAN_GPU_MEMORY),
    never more than the symbols."""
    if cfg.cohort is not None:
        return max(1, min(cfg.cohort, symbols))
    per_member = cfg.batch_size * stacked_saved_bytes_per_sample(cfg, features)
    return max(1, min(MAX_AUTO_COHORT, symbols, auto_cohort(PLAN_GPU_MEMORY, cfg.jobs_per_gpu, per_member)))


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
    return max(1, min(MAX_AUTO_COHORT, auto_cohort(total, cfg.jobs_per_gpu, per_member)))


def auto_cohort(memory_bytes: int, jobs_per_gpu: int | None, per_member_bytes: float) -> int:
    """Members whose activations COHORT_MEMORY_SHARE of a GPU's memory holds, shared by its workers."""
    return int(memory_bytes * COHORT_MEMORY_SHARE / max(1, jobs_per_gpu or 1) // max(per_member_bytes, 1.0))


def stacked_saved_bytes_per_sample(cfg: LstmConfig, features: int) -> float:
    """Bytes autograd saves per sample of one cohort member (measured on a stack of one, on the CPU)."""
    import torch

    from trainers.lstm.stacked import StackedLSTM

    model = StackedLSTM(1, features, cfg.hidden, cfg.layers, cfg.dropout).train()
    return saved_bytes_per_item(model, lambda b: (torch.randn(1, b, cfg.window, features),))
