"""Direction metrics beside their baselines, in NumPy (tests/lstm/test_lstm_metrics.py checks each one
against values worked out by hand).

Classification, on the labelled anchors of a split: accuracy beside the majority-class rate,
balanced accuracy, ROC AUC with its standard error, log loss and Brier score beside the base-rate
predictor (a constant: the training split's up rate), and a calibration table. Trading, on every
anchor of the split: long when P(up) > 0.5, flat otherwise, one bar at a time, net of a cost per
unit of position change, beside buy-and-hold over the same bars. A model "has skill" only when its
log loss beats the base rate's AND its AUC is above 0.5 by more than 1.96 standard errors.
"""

from __future__ import annotations

import math

import numpy as np

EPS = 1e-7  # probabilities are clipped to [EPS, 1 - EPS] for the log loss


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    ranks = np.empty(len(x))
    start = 0
    for end in np.r_[np.flatnonzero(np.diff(sorted_x)) + 1, len(x)]:
        ranks[order[start:end]] = (start + 1 + end) / 2.0
        start = end
    return ranks


def roc_auc(y: np.ndarray, p: np.ndarray) -> float | None:
    """Probability that a random up bar scores above a random down bar (ties count half); None when
    one class is absent."""
    n_pos = int((y == 1).sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    r = _ranks(np.asarray(p, dtype=np.float64))
    return float((r[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil (1982)."""
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, EPS, 1 - EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def brier(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean((p - y) ** 2))


def balanced_accuracy(y: np.ndarray, predicted_up: np.ndarray) -> float:
    """Mean of the recall of up bars and the recall of down bars."""
    recalls = [float(np.mean(predicted_up[y == c] == c)) for c in (0, 1) if (y == c).any()]
    return float(np.mean(recalls))


def calibration_table(y: np.ndarray, p: np.ndarray, bins: int) -> list[dict]:
    """Equal-count bins of the predicted probability (a model's probabilities crowd around 0.5, so
    fixed-width bins would leave most empty): range, count, mean prediction, observed up rate."""
    order = np.argsort(p, kind="mergesort")
    rows = []
    for part in np.array_split(order, min(bins, len(p))):
        if len(part) == 0:
            continue
        rows.append({"p_low": float(p[part].min()), "p_high": float(p[part].max()), "count": int(len(part)),
                     "mean_predicted": float(p[part].mean()), "observed_up_rate": float(y[part].mean())})
    return rows


def classification_metrics(y: np.ndarray, p: np.ndarray, train_up_rate: float, bins: int,
                           past_return: np.ndarray | None = None, linear_p: np.ndarray | None = None) -> dict:
    """y: 1 up / 0 down; p: the model's P(up). Baselines on exactly the same rows: the majority class,
    the base rate as a constant probability, persistence (the sign of the return over the previous
    horizon, and that return as a score for AUC) and a logistic regression's P(up) when given."""
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    up_rate = float(y.mean())
    predicted_up = (p > 0.5).astype(np.float64)
    auc = roc_auc(y, p)
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    se = auc_standard_error(auc, n_pos, n_neg) if auc is not None else None
    base = np.full_like(p, min(max(train_up_rate, EPS), 1 - EPS))
    train_majority = 1.0 if train_up_rate >= 0.5 else 0.0
    model = {"accuracy": float(np.mean(predicted_up == y)), "balanced_accuracy": balanced_accuracy(y, predicted_up),
             "roc_auc": auc, "roc_auc_se": se, "log_loss": log_loss(y, p), "brier": brier(y, p),
             "predicted_up_rate": float(predicted_up.mean()), "mean_probability": float(p.mean())}
    baselines = {"majority_class_rate": max(up_rate, 1 - up_rate),
                 "train_majority_accuracy": float(np.mean(y == train_majority)),
                 "base_rate": {"probability": float(base[0]), "log_loss": log_loss(y, base), "brier": brier(y, base)}}
    if past_return is not None:
        up_before = (np.asarray(past_return) > 0).astype(np.float64)
        baselines["persistence"] = {"accuracy": float(np.mean(up_before == y)),
                                    "balanced_accuracy": balanced_accuracy(y, up_before),
                                    "roc_auc": roc_auc(y, np.asarray(past_return, dtype=np.float64))}
    if linear_p is not None:
        q = np.asarray(linear_p, dtype=np.float64)
        baselines["logistic_regression"] = {"accuracy": float(np.mean((q > 0.5) == y)),
                                            "balanced_accuracy": balanced_accuracy(y, (q > 0.5).astype(np.float64)),
                                            "roc_auc": roc_auc(y, q), "log_loss": log_loss(y, q), "brier": brier(y, q)}
    return {"rows": int(len(y)), "up_rate": up_rate, "model": model, "baselines": baselines,
            "calibration": calibration_table(y, p, bins), "skill": skill_verdict(model, baselines)}


def skill_verdict(model: dict, baselines: dict) -> dict:
    """Plain words: skill only when the log loss beats the base rate's and the AUC clears 0.5 by
    1.96 standard errors."""
    reasons = []
    base_ll = baselines["base_rate"]["log_loss"]
    if not model["log_loss"] < base_ll:
        reasons.append(f"log loss {model['log_loss']:.4f} is not below the base rate's {base_ll:.4f}")
    auc, se = model["roc_auc"], model["roc_auc_se"]
    if auc is None:
        reasons.append("AUC undefined (one class only)")
    elif auc + 1.96 * se < 0.5:
        reasons.append(f"AUC {auc:.3f} +- {1.96 * se:.3f} is below 0.5 (worse than a coin)")
    elif not auc - 1.96 * se > 0.5:
        reasons.append(f"AUC {auc:.3f} +- {1.96 * se:.3f} includes 0.5")
    if reasons:
        return {"has_skill": False, "verdict": "no skill: " + "; ".join(reasons)}
    return {"has_skill": True, "verdict": f"skill: log loss {model['log_loss']:.4f} < base rate {base_ll:.4f}, "
                                          f"AUC {auc:.3f} +- {1.96 * se:.3f} above 0.5"}


def _curve(positions: np.ndarray, ret_1: np.ndarray, cost: float, bars_per_year: float) -> dict:
    """Hold `positions[k]` over the bar after anchor k; pay `cost` per unit of change (entry included)."""
    change = np.abs(np.diff(np.r_[0.0, positions]))
    net = positions * ret_1 + np.log1p(-cost * change)
    std = float(net.std(ddof=1)) if len(net) > 1 else 0.0
    return {"total_log_return": float(net.sum()), "total_return": float(np.expm1(net.sum())),
            "sharpe_annualised": float(net.mean() / std * math.sqrt(bars_per_year)) if std > 0 else None,
            "exposure": float(positions.mean()), "position_changes": int((change > 0).sum()),
            "costs_log": float(-np.log1p(-cost * change).sum())}


def long_flat_strategy(p: np.ndarray, ret_1: np.ndarray, cost_bps: float, bars_per_year: float) -> dict:
    """Long (1) when P(up) > 0.5, flat (0) otherwise, rebalanced every bar, beside buy-and-hold over
    the same bars. `ret_1[k]` is the log return of the bar after anchor k."""
    cost = cost_bps / 1e4
    positions = (np.asarray(p) > 0.5).astype(np.float64)
    ret_1 = np.asarray(ret_1, dtype=np.float64)
    strategy = _curve(positions, ret_1, cost, bars_per_year)
    hold = _curve(np.ones_like(positions), ret_1, cost, bars_per_year)
    return {"bars": int(len(ret_1)), "cost_bps": cost_bps, "bars_per_year": bars_per_year, "long_flat": strategy,
            "buy_and_hold": hold, "beats_buy_and_hold": strategy["total_log_return"] > hold["total_log_return"]}
