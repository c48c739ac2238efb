"""The simple models the Transformer must beat, fitted on the same training rows and label:

- ridge: linear regression on the flattened input window (the exact normalised features the
  model sees), closed form; the penalty picked from a grid by validation MSE;
- LightGBM (optional: `pip install -e '.[lightgbm]'`): gradient-boosted trees on a summary of each
  window (per feature: the last value, means over the last 5 and 20 days and the whole window,
  and the window's standard deviation), early-stopped on validation.

Both predict the label in its own units (the model's de-standardised output), on every split.
"""

from __future__ import annotations

import importlib.util
import os
import time

import numpy as np
import torch

from trainers.forecast.data import WindowStore

RIDGE_ALPHAS = tuple(float(a) for a in np.logspace(-3, 4, 15))  # x mean eigenvalue of the Gram matrix
LIGHTGBM_MAX_ROWS = 1_000_000  # subsample the training rows above this (seeded)
LIGHTGBM_PARAMS = {"objective": "regression", "learning_rate": 0.05, "num_leaves": 31, "min_data_in_leaf": 200,
                   "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
                   "verbose": -1, "seed": 0, "deterministic": True, "force_row_wise": True}
LIGHTGBM_ROUNDS = 1000
LIGHTGBM_THREADED_ROWS = 200_000
LIGHTGBM_PATIENCE = 50
CHUNK = 8192


def _standardised(store: WindowStore, y: torch.Tensor) -> torch.Tensor:
    return (y.double() - store.target_mean) / store.target_std


def _chunks(ids: torch.Tensor):
    for start in range(0, len(ids), CHUNK):
        yield ids[start:start + CHUNK]


@torch.no_grad()
def fit_ridge(store: WindowStore, splits=("val", "test")) -> tuple[dict, dict[str, np.ndarray]]:
    """Closed-form ridge on flattened windows; returns (info, {split: predictions in label units}).
    The Gram matrix is accumulated in float64 over chunks on the store's device."""
    t0 = time.perf_counter()
    ids = store.sample_ids["train"]
    dim = store.window * store.features.shape[-1]
    device = store.features.device
    gram = torch.zeros(dim, dim, dtype=torch.float64, device=device)
    xy = torch.zeros(dim, dtype=torch.float64, device=device)
    x_sum = torch.zeros(dim, dtype=torch.float64, device=device)
    y_sum = torch.zeros((), dtype=torch.float64, device=device)  # summed where it is: no wait per chunk
    for part in _chunks(ids):
        x, y = store.gather(part)
        x = x.reshape(len(part), dim).double()
        y = _standardised(store, y)
        gram += x.T @ x
        xy += x.T @ y
        x_sum += x.sum(0)
        y_sum += y.sum()
    n = len(ids)
    x_mean, y_mean = x_sum / n, y_sum / n
    gram -= n * torch.outer(x_mean, x_mean)  # centred: the intercept is not penalised
    xy -= n * x_mean * y_mean
    scale = float(torch.trace(gram)) / dim
    eye = torch.eye(dim, dtype=torch.float64, device=device)

    def predict(weights: torch.Tensor, split: str) -> np.ndarray:
        out = []
        for part in _chunks(store.sample_ids[split]):
            x, _ = store.gather(part)
            out.append((x.reshape(len(part), dim).double() - x_mean) @ weights + y_mean)
        return (torch.cat(out) * store.target_std + store.target_mean).cpu().numpy()

    val_y = store.target[store.date_index(store.sample_ids["val"]), store.sample_ids["val"] % store.n_tickers]
    val_y = val_y.double().cpu().numpy()
    grid, best = [], None
    for alpha in RIDGE_ALPHAS:
        weights = torch.linalg.solve(gram + alpha * scale * eye, xy)
        mse = float(np.mean((predict(weights, "val") - val_y) ** 2))
        grid.append({"alpha": alpha, "val_mse": mse})
        if best is None or mse < best[1]:
            best = (alpha, mse, weights)
    alpha, mse, weights = best
    info = {"features": f"the flattened input window ({store.window} days x {store.features.shape[-1]} features)",
            "alpha": alpha, "penalty": alpha * scale, "val_mse": mse, "grid": grid, "train_rows": n,
            "seconds": time.perf_counter() - t0}
    return info, {split: predict(weights, split) for split in splits}


@torch.no_grad()
def window_summary(store: WindowStore, ids: torch.Tensor) -> np.ndarray:
    """[len(ids), 5 * F]: per feature the last value, the means over the last 5 and 20 days and the
    whole window, and the window's standard deviation."""
    out = []
    for part in _chunks(ids):
        x, _ = store.gather(part)
        out.append(torch.cat([x[:, -1], x[:, -5:].mean(1), x[:, -20:].mean(1), x.mean(1), x.std(1)], dim=1))
    return torch.cat(out).float().cpu().numpy()


def lightgbm_available() -> bool:
    return importlib.util.find_spec("lightgbm") is not None


LIGHTGBM_MISSING = "lightgbm is not installed (pip install -e '.[lightgbm]'); no LightGBM baseline"


def fit_lightgbm(store: WindowStore, splits=("val", "test")) -> tuple[dict, dict[str, np.ndarray]]:
    """LightGBM on window summaries, early-stopped on validation MSE. ({"skipped": why}, {}) when
    the library is not installed."""
    if not lightgbm_available():
        return {"skipped": LIGHTGBM_MISSING}, {}
    import lightgbm as lgb

    t0 = time.perf_counter()
    ids = store.sample_ids["train"]
    if len(ids) > LIGHTGBM_MAX_ROWS:
        keep = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))[:LIGHTGBM_MAX_ROWS]
        ids = ids[keep.to(ids.device).sort().values]

    def label(split_ids: torch.Tensor) -> np.ndarray:
        return store.target[store.date_index(split_ids), split_ids % store.n_tickers].double().cpu().numpy()

    # Threads only pay off on large data: on a few thousand rows OpenMP's spinning threads cost more
    # than they save (measured: 1.3 s with 1 thread, 9 s with 2 on a busy 2-core machine).
    threads = 1 if len(ids) < LIGHTGBM_THREADED_ROWS else len(os.sched_getaffinity(0))
    params = {**LIGHTGBM_PARAMS, "num_threads": threads}
    train = lgb.Dataset(window_summary(store, ids), label(ids), free_raw_data=True)
    val_ids = store.sample_ids["val"]
    val = lgb.Dataset(window_summary(store, val_ids), label(val_ids), reference=train)
    booster = lgb.train(params, train, num_boost_round=LIGHTGBM_ROUNDS, valid_sets=[val],
                        callbacks=[lgb.early_stopping(LIGHTGBM_PATIENCE, verbose=False)])
    preds = {split: booster.predict(window_summary(store, store.sample_ids[split]),
                                    num_iteration=booster.best_iteration) for split in splits}
    info = {"features": f"a summary of each window ({5 * store.features.shape[-1]} columns: last, mean of the "
                        f"last 5 / 20 / all days, std, per feature)", "rounds": int(booster.best_iteration),
            "train_rows": int(len(ids)), "params": params, "seconds": time.perf_counter() - t0,
            "version": lgb.__version__}
    return info, preds
