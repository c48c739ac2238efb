"""Signal and portfolio metrics in Qlib's conventions. Pure NumPy and pandas (no torch).

Signal, per anchor date across that date's tickers: IC (Pearson) and Rank IC (Spearman) of a
forecast against the realised forward log return. Summary over dates: mean, std, ICIR
(mean / std), t = mean / std * sqrt(dates) as Qlib and most papers print it, and t_nw, the same
mean over its Newey-West standard error with `horizon - 1` lags: consecutive anchor dates'
`horizon`-day forward returns overlap, so their ICs are correlated and the plain t overstates the
evidence (by about sqrt(horizon) when the correlation is strong). The verdict uses t_nw.

Portfolios: rebalanced every `horizon` anchor dates from the split's first (non-overlapping holds:
each holding period is exactly the forward return the forecast was made for). On each rebalance
date the top-k names by forecast are held long, the bottom-k short (long-short: the mean return
of the longs minus that of the shorts, Qlib's convention) or only the top-k (long-only), equally
weighted; the equal-weight portfolio holds every name with a forward return on that date. Costs:
`cost_bps` per unit of notional traded, where the traded notional at a rebalance is
sum |w_new - w_old| over names (the first rebalance buys the whole book; weight drift within a
period is ignored). Annualised with 252 trading days: return geometric, volatility and Sharpe
(no risk-free rate) from the per-period net returns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MIN_NAMES = 5  # a date with fewer names has no IC (a correlation of 3 points says nothing)
TRADING_DAYS = 252
SKILL_T = 2.0


def per_date_ic(date_index: np.ndarray, score: np.ndarray, target: np.ndarray, rank: bool = False,
                min_names: int = MIN_NAMES) -> pd.Series:
    """Correlation across tickers of `score` and `target` for each date with >= min_names rows
    (Spearman when `rank`: Pearson of the within-date ranks, ties averaged). Index: date index.
    Dates where either side is constant are left out."""
    frame = pd.DataFrame({"d": date_index, "s": score, "y": target})
    frame = frame[frame.groupby("d")["s"].transform("size") >= min_names]
    if frame.empty:
        return pd.Series(dtype=float)
    if rank:
        frame = frame.assign(s=frame.groupby("d")["s"].rank(), y=frame.groupby("d")["y"].rank())
    s = frame["s"] - frame.groupby("d")["s"].transform("mean")
    y = frame["y"] - frame.groupby("d")["y"].transform("mean")
    cov = (s * y).groupby(frame["d"]).sum()
    denom = np.sqrt((s * s).groupby(frame["d"]).sum() * (y * y).groupby(frame["d"]).sum())
    return (cov / denom.where(denom > 1e-300)).dropna()


def newey_west_t(x: np.ndarray, lags: int) -> float | None:
    """mean(x) / its Newey-West (Bartlett kernel) standard error with `lags` lags."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < 2:
        return None
    e = x - x.mean()
    var = e @ e / n
    for lag in range(1, min(lags, n - 1) + 1):
        var += 2.0 * (1.0 - lag / (lags + 1.0)) * (e[lag:] @ e[:-lag]) / n
    if var <= 0:
        return None
    return float(x.mean() / np.sqrt(var / n))


def newey_west_se(x: np.ndarray, lags: int) -> float | None:
    """The Newey-West (Bartlett kernel) standard error of mean(x) with `lags` lags."""
    x = np.asarray(x, dtype=np.float64)
    t = newey_west_t(x, lags)
    if t is None or t == 0:
        return None
    return float(abs(x.mean() / t))


def paired_difference(a: pd.Series, b: pd.Series, horizon: int) -> dict:
    """Per-date differences of two forecasts' IC series (indexed by date) on the dates both have:
    their mean, its Newey-West standard error and t (`horizon - 1` lags, as for the IC itself).
    Paired, so the day-to-day swings both forecasts share cancel: the honest test of "ahead of"."""
    both = a.index.intersection(b.index)
    diff = (a.loc[both] - b.loc[both]).to_numpy(dtype=np.float64)
    if len(diff) < 2:
        return {"mean": float(diff.mean()) if len(diff) else None, "se_nw": None, "t_nw": None,
                "dates": int(len(diff))}
    return {"mean": float(diff.mean()), "se_nw": newey_west_se(diff, horizon - 1),
            "t_nw": newey_west_t(diff, horizon - 1), "dates": int(len(diff))}


def rank_average(date_index: np.ndarray, scores: list[np.ndarray]) -> np.ndarray:
    """The equal-weight average of each forecast's rank among its date's rows, scaled to [-1, 1]
    (ties averaged; 0 on a date with one row): an ensemble that needs no common scale, so a model
    of ranks and a model of returns weigh the same."""
    out = np.zeros(len(date_index), dtype=np.float64)
    for score in scores:
        frame = pd.DataFrame({"d": date_index, "s": score})
        ranks = frame.groupby("d")["s"].rank().to_numpy()
        names = frame.groupby("d")["s"].transform("size").to_numpy()
        out += np.where(names > 1, 2.0 * (ranks - 1.0) / np.maximum(names - 1, 1) - 1.0, 0.0)
    return out / max(len(scores), 1)


def ic_summary(ic: np.ndarray, horizon: int) -> dict:
    ic = np.asarray(ic, dtype=np.float64)
    n = len(ic)
    if n == 0:
        return {"mean": None, "std": None, "icir": None, "t": None, "t_nw": None, "nw_lags": horizon - 1,
                "positive_share": None, "dates": 0}
    std = float(ic.std(ddof=1)) if n > 1 else None
    return {"mean": float(ic.mean()), "std": std, "icir": float(ic.mean() / std) if std else None,
            "t": float(ic.mean() / std * np.sqrt(n)) if std else None,
            "t_nw": newey_west_t(ic, horizon - 1), "nw_lags": horizon - 1,
            "positive_share": float(np.mean(ic > 0)), "dates": n}


def rebalance_dates(date_index: np.ndarray, horizon: int) -> list[int]:
    """The first anchor date, then the first date at least `horizon` dates after the previous one."""
    out: list[int] = []
    for d in np.unique(date_index):
        if not out or d >= out[-1] + horizon:
            out.append(int(d))
    return out


def _turnover(new: dict[int, float], old: dict[int, float]) -> float:
    return float(sum(abs(new.get(k, 0.0) - old.get(k, 0.0)) for k in new.keys() | old.keys()))


def wealth(period_returns: np.ndarray) -> np.ndarray:
    """Equity after each period from 1, floored at 0: a book that loses everything stays ruined
    (a short can lose more than the book in one period; compounding two such losses must not
    turn into a gain)."""
    return np.cumprod(np.clip(1.0 + period_returns, 0.0, None))


def performance(net: np.ndarray, gross: np.ndarray, turnover: np.ndarray, horizon: int) -> dict:
    """Annualised figures of per-period returns (one period = `horizon` trading days)."""
    n = len(net)
    if n == 0:
        return {"periods": 0, "ann_return": None, "ann_return_gross": None, "ann_vol": None, "sharpe": None,
                "max_drawdown": None, "turnover": None, "total_return": None}
    per_year = TRADING_DAYS / horizon
    equity = wealth(net)
    peak = np.maximum.accumulate(np.concatenate([[1.0], equity]))[1:]
    vol = float(net.std(ddof=1) * np.sqrt(per_year)) if n > 1 else None
    gross_end = wealth(gross)[-1]
    ann = float(equity[-1] ** (per_year / n) - 1.0) if equity[-1] > 0 else -1.0
    ann_gross = float(gross_end ** (per_year / n) - 1.0) if gross_end > 0 else -1.0
    return {"periods": n, "ann_return": ann, "ann_return_gross": ann_gross, "ann_vol": vol,
            "sharpe": float(net.mean() * per_year / vol) if vol else None,
            "max_drawdown": float(np.min(equity / peak - 1.0).clip(max=0.0)),
            "turnover": float(turnover.mean()), "total_return": float(equity[-1] - 1.0)}


def backtest(date_index: np.ndarray, ticker_index: np.ndarray, score: np.ndarray | None, fwd_log_return: np.ndarray,
             horizon: int, top_k: int | None, cost_bps: float) -> dict:
    """{"long_short", "long_only"} (or {"equal_weight"} when `score` is None): performance and, under
    "curve", the rebalance dates and the net equity after each period (for the pictures).
    `top_k` None: a fifth of the names on each date; never more than half of them."""
    simple = np.expm1(fwd_log_return)
    order = np.lexsort((ticker_index, date_index))
    d_sorted = date_index[order]
    starts = np.searchsorted(d_sorted, rebalance_dates(date_index, horizon))
    ends = np.searchsorted(d_sorted, rebalance_dates(date_index, horizon), side="right")
    books = ("equal_weight",) if score is None else ("long_short", "long_only")
    rows: dict[str, list[tuple[int, float, float, float]]] = {b: [] for b in books}  # date, net, traded, gross
    held: dict[str, dict[int, float]] = {b: {} for b in books}
    names_held: list[int] = []  # k on each rebalance date (top_k, capped at half the names there)
    for a, b in zip(starts, ends):
        idx = order[a:b]
        n = len(idx)
        if score is None:
            weights = {"equal_weight": {int(t): 1.0 / n for t in ticker_index[idx]}}
        else:
            if n < 2:
                continue
            k = max(1, round(n / 5)) if top_k is None else top_k
            k = min(k, n // 2)
            names_held.append(k)
            ranked = idx[np.lexsort((ticker_index[idx], score[idx]))]  # ascending; ties by ticker
            longs, shorts = ranked[-k:], ranked[:k]
            weights = {"long_short": {**{int(t): -1.0 / k for t in ticker_index[shorts]},
                                      **{int(t): 1.0 / k for t in ticker_index[longs]}},
                       "long_only": {int(t): 1.0 / k for t in ticker_index[longs]}}
        r = dict(zip(ticker_index[idx].tolist(), simple[idx].tolist()))
        for book, w in weights.items():
            gross = sum(wt * r[t] for t, wt in w.items())
            traded = _turnover(w, held[book])
            held[book] = w
            rows[book].append((int(date_index[idx[0]]), gross - cost_bps * 1e-4 * traded, traded, gross))
    out = {}
    for book, got in rows.items():
        arr = np.array([g[1:] for g in got], dtype=np.float64).reshape(-1, 3)
        net, traded, gross = arr[:, 0], arr[:, 1], arr[:, 2]
        out[book] = performance(net, gross, traded, horizon)
        if score is not None:  # what was really held: --top-k is capped at half the names on a date
            out[book]["names_held"] = {"min": min(names_held), "max": max(names_held)} if names_held else None
        # equity of 1 at the first rebalance, then after each holding period (at its end date)
        ends = [g[0] + horizon for g in got]
        out[book]["curve"] = {"dates": [got[0][0], *ends] if got else [],
                              "equity": [1.0, *wealth(net).tolist()] if got else []}
    return out


def decile_returns(date_index: np.ndarray, score: np.ndarray, fwd_log_return: np.ndarray, groups: int = 10) -> list:
    """Mean forward simple return of each forecast decile (1 = lowest): per date the names are cut
    into `groups` by forecast rank, each group's mean is taken, then averaged over dates."""
    frame = pd.DataFrame({"d": date_index, "s": score, "r": np.expm1(fwd_log_return)})
    pct = frame.groupby("d")["s"].rank(method="first", pct=True)
    frame["g"] = np.ceil(pct * groups).astype(int).clip(1, groups)
    means = frame.groupby(["d", "g"])["r"].mean().groupby("g").mean()
    return [float(means.get(g, np.nan)) if g in means.index else None for g in range(1, groups + 1)]


def verdict(rank_ic: dict, long_short: dict) -> tuple[str, str]:
    """("skill", why) only when the Rank IC's Newey-West t > 2 and the long-short portfolio
    returns more than 0 a year after costs; ("no skill detected", why) otherwise."""
    t, ls = rank_ic.get("t_nw"), long_short.get("ann_return")
    t_text = "n/a" if t is None else f"{t:.2f}"
    ls_text = "n/a" if ls is None else f"{ls:+.2%}"
    mean = rank_ic.get("mean")
    why = (f"Rank IC {'n/a' if mean is None else f'{mean:+.4f}'}, Newey-West t {t_text} (skill needs > {SKILL_T:g}); "
           f"long-short {ls_text} a year after costs (skill needs > 0)")
    if t is not None and t > SKILL_T and ls is not None and ls > 0:
        return "skill", why
    return "no skill detected", why
