"""The forecaster's job for the planner: parameters from the model on the meta device, FLOPs from
model.py, and the bytes autograd saves for backward, counted per sample (tested against
`torch.autograd.graph.saved_tensors_hooks` in tests/forecast/test_forecast_size.py)."""

from __future__ import annotations

import sys
from dataclasses import replace

from trainers.forecast.config import PRESETS, ForecastConfig, feature_names, refuse_steps_larger_than_the_split
from trainers.market.sources import trading_days
from trainers.market.windows import plan_splits, plan_walk_forward
from trainers.ops.plan import Workload

# The least a step takes on a GPU, whatever its FLOPs: kernel launches and Python (ASSUMED, as the other small
# models' floors). The H200 measured the small preset (3.2 M parameters, batch 256) at 7.8 ms a step eager and
# 9.7 ms compiled (bench/results/gpu_h200/train_gpu_*.json); the tiny one, fewer layers, was never measured, and
# without a floor the plan promised it hundreds of millions of samples a second at the 151m's MFU.
SMALL_STEP_S = 0.003


# Twelve parameters: the model's sizes as numbers, as Forecaster takes them (`plan` sizes a run before any config is
# settled, from its flags alone).
def activation_bytes_per_sample(window: int, n_features: int, d_model: int, n_layers: int, n_heads: int, d_ff: int,
                                dropout: float, compute_bytes: int, readout: str = "last", linear_skip: bool = False,
                                past_returns: bool = False, encoder: str = "transformer") -> int:
    """Per block (pre-norm, SDPA): the norm input, the qkv input, q, k, v and the attention output,
    the projection input, the second norm's input, the MLP input (8 x T x d); the GELU input and
    output (2 x T x d_ff); norm statistics and the attention's log-sum-exp in fp32; with dropout on,
    each residual branch's mask, saved in the compute dtype. Plus the input (one more channel with
    past returns; the linear skip's copy of it), and the readout: the last day's final norm and
    head inputs (d each), the whole window's norm input for the mean (T x d), and for an attention
    pool also the normalised states it weighs and its softmax (T x d and T)."""
    t, d = window, d_model
    inputs = t * (n_features + past_returns)
    skip = inputs if linear_skip else 0
    if encoder == "none":  # the skip's input is all there is
        return inputs * compute_bytes
    readout_compute = {"last": 2 * d, "mean": t * d + d, "attention": 2 * t * d + d}[readout]
    compute = inputs + skip + n_layers * (8 * t * d + 2 * t * d_ff) + readout_compute
    fp32 = n_layers * (n_heads * t + 4 * t) + 2 * t + (2 * t if readout == "attention" else 0)
    masks = n_layers * 2 * t * d if dropout > 0 else 0
    return (compute + masks) * compute_bytes + fp32 * 4


def training_samples(cfg: ForecastConfig) -> tuple[int, bool]:
    per_fold, estimated = fold_samples(cfg)
    return sum(per_fold), estimated


def fold_samples(cfg: ForecastConfig) -> tuple[list[int], bool]:
    """(the samples of one epoch, whether estimated), summed over the folds the job trains (--walk-forward K: K runs,
    each on its own training range; --fold k: that one). Data on this machine (a file, a cache that holds prices)
    is loaded as the job loads it (validated, within the dates, the point-in-time universe) and its training
    samples counted. Data not fetched yet (yfinance; the deploy's cache, which its data phase fills after this
    check) is estimated: the trading days between the dates (else --years back from today) times the tickers
    asked for (the universe's; for sp500-pit, its members on an average day). It once counted 25 years of the 503
    members for every real source whatever --tickers or the dates said, and one run for a walk-forward."""
    folds = [cfg.fold] if cfg.fold is not None else list(range(cfg.walk_forward)) or [None]
    if cfg.source.startswith("file:") or (cfg.source == "cache" and holds_prices(cfg.cache_dir)):
        from trainers.forecast.data import load_market, split_plan, store_from

        market = load_market(cfg, log=lambda line: print(line, file=sys.stderr))
        n_dates = len(market.arrays.dates)
        return [store_from(market.arrays, split_plan(replace(cfg, fold=k), n_dates), cfg.target).stats["train"]
                for k in folds], False
    if cfg.source == "synthetic":
        dates, tickers = cfg.synthetic_days, cfg.synthetic_tickers
    else:  # (an empty cache: what a yfinance fetch of the same options fills it with)
        dates, tickers = yfinance_shape(replace(cfg, source="yfinance"))
    if cfg.walk_forward:  # (the split sizes the job refuses, refused alike: --min-split-dates)
        plans = plan_walk_forward(dates, cfg.window, cfg.horizon, cfg.val_frac, cfg.test_frac, cfg.min_split_dates,
                                  cfg.walk_forward)
        spans = [plans[k].ranges["train"] for k in folds]
    else:
        spans = [plan_splits(dates, cfg.window, cfg.horizon, cfg.val_frac, cfg.test_frac,
                             cfg.min_split_dates).ranges["train"]]
    return [round((stop - start) * tickers) for start, stop in spans], cfg.source != "synthetic"


def holds_prices(cache_dir: str) -> bool:
    from pathlib import Path

    from trainers.market.fetch import PriceCache

    return bool(PriceCache(Path(cache_dir)).metadata().get("tickers"))


def yfinance_shape(cfg: ForecastConfig) -> tuple[int, float]:
    """(trading days, tickers a day) of a yfinance job before its fetch (see training_samples)."""
    from trainers.forecast.data import data_request

    request = data_request(cfg)
    start, end = request.date_range()
    dates = trading_days(start, end)
    if cfg.universe != "sp500-pit":
        return dates, len(request.tickers)
    import pandas as pd

    from trainers.market.pit import load_history, membership_mask

    days = pd.bdate_range(start[:10], end[:10], inclusive="left")
    return dates, float(membership_mask(load_history(), days, request.tickers).sum(axis=1).mean())


def workload(cfg: ForecastConfig, compute_bytes: int = 2) -> Workload:
    import torch

    from trainers.forecast.build import build_model, model_flops

    shape = PRESETS[cfg.preset]
    with torch.device("meta"):
        model = build_model(cfg)
    parameters = sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]  # none with --encoder none: the
    block = max(blocks, default=parameters)  # linear skip is the whole model, one unit for FSDP2
    n_features = len(feature_names(cfg))  # all of them unless --features says otherwise (no data is read here)
    per_sample = activation_bytes_per_sample(cfg.window, n_features, shape.d_model, shape.n_layers, shape.n_heads,
                                             shape.d_ff, cfg.dropout, compute_bytes, cfg.readout, cfg.linear_skip,
                                             cfg.past_returns, cfg.encoder)
    per_fold, estimated = fold_samples(cfg)
    samples = sum(per_fold)

    def refuse_steps_larger_than_a_split(gpus: int) -> None:  # as each run does (forecast.train)
        for n_train in per_fold:
            refuse_steps_larger_than_the_split(cfg, gpus, n_train)

    def capped(items_per_step: float) -> float:  # each run (fold) stops at --max-steps
        return float(sum(min(n * cfg.epochs, cfg.max_steps * items_per_step) for n in per_fold))

    return Workload(
        trainer="forecast", parameters=parameters, n_blocks=len(blocks), block_parameters=block, unit="samples",
        items_per_micro=cfg.batch_size, grad_accum=cfg.grad_accum,
        flops_per_item=model_flops(cfg, n_features),
        activation_bytes=lambda micro, _checkpointing: per_sample * micro, kind="transformer", strategies=("ddp",),
        min_micro_step_s=SMALL_STEP_S, check_gpus=refuse_steps_larger_than_a_split,
        capped_items=capped if cfg.max_steps is not None else None,
        items_total=float(samples * cfg.epochs), shape={"preset": cfg.preset, **vars(shape), "window": cfg.window},
        notes=[f"one epoch is {samples:,} samples"
               + (f" in all over the {cfg.walk_forward} folds (--walk-forward: each a run)"
                  if cfg.walk_forward and cfg.fold is None else "")
               + (" (estimated before the fetch: the exact count depends on each ticker's history)"
                  if estimated else "")
               # the plan counts the data its --source names: by default the synthetic demo's market, where a
               # deploy trains on the S&P 500 (issue 66: a newcomer read the demo's count as the deploy's)
               + (f" of the synthetic market (--source {cfg.source}; plan with --source cache or yfinance for the "
                  "S&P 500 a deploy fetches)" if cfg.source == "synthetic" else f" of --source {cfg.source}")])
