"""Forecast metrics and the baselines they must be read beside, on exactly the same rows."""

from __future__ import annotations

import numpy as np
import pandas as pd


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
