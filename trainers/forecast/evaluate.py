"""Evaluation: the model's forecasts beside the baselines, on exactly the same rows.

`forecast_metrics` is pure NumPy; the rest predicts with the model, sharded over ranks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from trainers.forecast.config import ForecastConfig
from trainers.forecast.data import WindowStore, load_store
from trainers.runtime.dist import (
    DistContext,
    all_gather_object,
    all_reduce_sum,
    barrier,
    distributed,
)
from trainers.runtime.precision import autocast


def _per_date_ic(date_index: np.ndarray, score: np.ndarray, target: np.ndarray, min_names: int = 5) -> np.ndarray:
    """Spearman rank correlation across tickers, one value per date with >= min_names rows."""
    frame = pd.DataFrame({"d": date_index, "s": score, "y": target})
    counts = frame.groupby("d")["s"].transform("size")
    frame = frame[counts >= min_names]
    if frame.empty:
        return np.array([])
    ranks = frame.groupby("d")[["s", "y"]].rank()
    ranks["d"] = frame["d"].to_numpy()
    ranks["s"] -= ranks.groupby("d")["s"].transform("mean")
    ranks["y"] -= ranks.groupby("d")["y"].transform("mean")
    cov = (ranks["s"] * ranks["y"]).groupby(ranks["d"]).sum()
    var_s = (ranks["s"] ** 2).groupby(ranks["d"]).sum()
    var_y = (ranks["y"] ** 2).groupby(ranks["d"]).sum()
    denom = np.sqrt(var_s * var_y)
    ic = (cov / denom.where(denom > 0)).dropna()
    return ic.to_numpy()


def _ic_summary(ic: np.ndarray) -> dict:
    if len(ic) == 0:
        return {"ic_mean": None, "ic_std": None, "ic_ir": None, "ic_dates": 0}
    std = float(ic.std(ddof=1)) if len(ic) > 1 else None
    return {"ic_mean": float(ic.mean()), "ic_std": std,
            "ic_ir": float(ic.mean() / std) if std else None, "ic_dates": int(len(ic))}


def forecast_metrics(date_index: np.ndarray, pred: np.ndarray, target: np.ndarray, past_return: np.ndarray,
                     train_target_mean: float) -> dict:
    """Model metrics and baselines: always-up, persistence (sign of the past horizon's return),
    zero-return MSE and train-mean MSE. `up_rate` is the share of rows whose target is > 0."""
    up = target > 0
    model = {"mse": float(np.mean((pred - target) ** 2)),
             "directional_accuracy": float(np.mean((pred > 0) == up))}
    model.update(_ic_summary(_per_date_ic(date_index, pred, target)))
    persistence = {"directional_accuracy": float(np.mean((past_return > 0) == up))}
    persistence.update(_ic_summary(_per_date_ic(date_index, past_return, target)))
    baselines = {
        "always_up": {"directional_accuracy": float(np.mean(up))},
        "persistence": persistence,
        "zero_return": {"mse": float(np.mean(target ** 2))},
        "train_mean": {"mse": float(np.mean((target - train_target_mean) ** 2))},
    }
    return {"rows": int(len(target)), "dates": int(len(np.unique(date_index))), "up_rate": float(np.mean(up)),
            "model": model, "baselines": baselines}


@torch.no_grad()
def predict_split(model, store: WindowStore, split: str, ctx: DistContext, batch_size: int,
                  precision) -> tuple[np.ndarray, np.ndarray] | None:
    """Predicted log returns for every sample of `split`, sharded over ranks, gathered on rank 0."""
    model.eval()
    ids = store.sample_ids[split][ctx.rank::ctx.world_size]
    preds = []
    for start in range(0, len(ids), batch_size):
        x, _ = store.gather(ids[start:start + batch_size])
        with autocast(ctx.device, precision):
            preds.append(model.predict_return(x).float())
    local = (ids.cpu().numpy(), torch.cat(preds).cpu().numpy() if preds else np.zeros(0, np.float32))
    parts = all_gather_object(ctx, local)
    if not ctx.is_main:
        return None
    all_ids = np.concatenate([p[0] for p in parts])
    all_pred = np.concatenate([p[1] for p in parts])
    order = np.argsort(all_ids)
    return all_ids[order], all_pred[order]


def evaluate_splits(model, store: WindowStore, ctx: DistContext, batch_size: int, precision,
                    splits=("val", "test")) -> dict | None:
    """Collective; the metrics of every split on rank 0 (None elsewhere)."""
    out = {}
    for split in splits:
        got = predict_split(model, store, split, ctx, batch_size, precision)
        if got is None:
            continue
        ids, pred = got
        ids_t = torch.from_numpy(ids).to(store.target.device)
        t = store.date_index(ids_t)
        n = ids_t - t * store.n_tickers
        out[split] = forecast_metrics(t.cpu().numpy(), pred.astype(np.float64),
                                      store.target[t, n].double().cpu().numpy(),
                                      store.past_return[t, n].double().cpu().numpy(), store.target_mean)
    return out if ctx.is_main else None


@torch.no_grad()
def validation_loss(model, store: WindowStore, ctx: DistContext, batch_size: int, precision) -> float:
    """Mean squared error in standardised units over the whole validation split (all ranks agree)."""
    model.eval()
    ids = store.sample_ids["val"][ctx.rank::ctx.world_size]
    sse = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for start in range(0, len(ids), batch_size):
        x, y = store.gather(ids[start:start + batch_size])
        with autocast(ctx.device, precision):
            pred = model(x).float()
        sse += ((pred - (y - store.target_mean) / store.target_std) ** 2).sum()
    total_sse, count = all_reduce_sum(ctx, [float(sse), float(len(ids))])
    model.train()
    return total_sse / count


def log_summary(log, evaluation: dict) -> None:
    for split in ("val", "test"):
        e = evaluation[split]
        log.info("%s: model acc %.4f mse %.3e IC %s | always-up %.4f persistence %.4f zero-mse %.3e",
                 split, e["model"]["directional_accuracy"], e["model"]["mse"],
                 "n/a" if e["model"]["ic_mean"] is None else f"{e['model']['ic_mean']:.4f}",
                 e["baselines"]["always_up"]["directional_accuracy"],
                 e["baselines"]["persistence"]["directional_accuracy"], e["baselines"]["zero_return"]["mse"])


def evaluate_run(run_dir: str, checkpoint: str = "best", device: str = "auto") -> dict | None:
    """`trainers forecast evaluate`: re-evaluate a run's checkpoint (one process or under torchrun)."""
    from trainers.forecast.train import build_model
    from trainers.runtime.logs import get_logger
    from trainers.runtime.precision import precision_for
    from trainers.runtime.results import merge_results
    from trainers.runtime.rundir import exclusive, load_checkpoint_states, load_run_config

    cfg = load_run_config(Path(run_dir), ForecastConfig)
    with distributed(device, cfg.collective_timeout_s) as ctx, exclusive(Path(run_dir), ctx):
        log = get_logger(ctx.rank, None)
        step, states = load_checkpoint_states(Path(run_dir), checkpoint, str(ctx.device))
        store, _ = load_store(cfg, log=print if ctx.is_main else (lambda _msg: None))
        store.to(ctx.device)
        precision = precision_for(ctx.device, cfg.precision if ctx.device.type == "cuda" else "auto")
        model = build_model(cfg).to(ctx.device)
        model.load_state_dict(states["model"])
        evaluation = evaluate_splits(model, store, ctx, cfg.eval_batch_size, precision)
        if ctx.is_main:
            evaluation["checkpoint_step"] = step
            log_summary(log, evaluation)
            merge_results(Path(run_dir), {"evaluation": evaluation}, log.warning)
        barrier(ctx)
        return evaluation
