"""The per-symbol LSTMs for the planner: many small independent models, `--jobs-per-gpu` of them on
each GPU at once. Counted on the real model (it is small) on the CPU: parameters, FLOPs per sample,
and the bytes autograd saves per sample (trainers.ops.plan.saved_bytes_per_item)."""

from __future__ import annotations

from trainers.lstm.config import LstmConfig
from trainers.ops.plan import Workload, forward_flops, saved_bytes_per_item

DEFAULT_SYMBOLS = 3  # the seed's BTC-USD, ETH-USD, SOL-USD when none are named
SMALL_STEP_S = 0.003  # an eager step of a small model on a GPU: launches and Python, not FLOPs (assumed)


def workload(cfg: LstmConfig) -> Workload:
    import torch

    from trainers.lstm.build import build_model

    model = build_model(cfg).train()
    n_in = model.lstm.input_size
    per_sample = saved_bytes_per_item(model, lambda b: (torch.randn(b, cfg.window, n_in),))
    flops = 3 * forward_flops(model, (torch.randn(1, cfg.window, n_in),))
    parameters = sum(p.numel() for p in model.parameters())
    symbols = len(cfg.symbols.split(",")) if cfg.symbols else DEFAULT_SYMBOLS
    days = cfg.synthetic_days if cfg.source == "synthetic" else int((cfg.years or 10) * 365)
    samples = int(days * (1 - cfg.val_frac - cfg.test_frac)) * symbols * cfg.epochs
    k = max(1, cfg.jobs_per_gpu or 1)
    return Workload(
        trainer="lstm", parameters=parameters, n_blocks=1, block_parameters=parameters, unit="samples",
        items_per_micro=cfg.batch_size, grad_accum=1, flops_per_item=flops,
        activation_bytes=lambda micro, _ck: int(per_sample * micro), kind="small", strategies=("ddp",),
        items_total=float(samples), jobs_per_gpu=k, independent=True, min_step_s=SMALL_STEP_S,
        shape={"hidden": cfg.hidden, "layers": cfg.layers, "window": cfg.window, "symbols": symbols},
        notes=[f"{symbols} independent models, {k} at a time per GPU (no gradient traffic between them); about "
               f"{samples:,} samples in all (window {cfg.window}, {cfg.epochs} epochs)"])
