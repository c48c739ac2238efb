"""A deterministic synthetic market: market factor, sectors, fat tails, volatility clustering.

Labelled synthetic everywhere it goes (tickers are SYN000..., the frame's attrs say so, results
record it). It has a weak, real effect in idiosyncratic returns so a model has something to find;
its size is a parameter, and the default is small, as in real markets. Its shape is `effect`:

    momentum  today's idiosyncratic return leans on the trailing 20-day idiosyncratic mean: linear in
              the past returns, so ridge on the window (and the past 20-day return itself) captures
              nearly all of it;
    regime    the same lean, but reversed while the stock is turbulent (its trailing 20-day volatility
              above a threshold; momentum crashes in volatile markets, Daniel & Moskowitz 2016): the
              sign depends on a second input, a product no linear model of the window can express.

`planted_effect` computes the lean from the innovations; `synthetic_truth` returns it with the
inputs it is made of (tests/forecast/test_forecast_markets.py checks a linear model of them stays far
below it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainers.errors import UsageError

N_SECTORS = 11
EFFECTS = ("momentum", "regime")
LEAN_DAYS = 20  # the effect reads the trailing 20 days (the forecaster's default horizon)
REGIME_QUANTILE = 0.7  # the regime market reverses above this quantile of the trailing volatility


def _garch_vols(rng: np.random.Generator, n_days: int, n_series: int, base_vol: np.ndarray,
                shocks: np.ndarray, alpha: float = 0.08, beta: float = 0.9) -> np.ndarray:
    """GARCH(1,1) returns: volatility clusters, unconditional vol equal to `base_vol`."""
    omega = base_vol**2 * (1.0 - alpha - beta)
    var = base_vol**2
    out = np.empty((n_days, n_series))
    for t in range(n_days):
        r = np.sqrt(var) * shocks[t]
        out[t] = r
        var = omega + alpha * r**2 + beta * var
    return out


def _student_t(rng: np.random.Generator, df: float, shape: tuple[int, ...]) -> np.ndarray:
    """Unit-variance Student-t: fat tails."""
    return rng.standard_t(df, size=shape) / np.sqrt(df / (df - 2.0))


def _trailing(x: np.ndarray, days: int = LEAN_DAYS) -> np.ndarray:
    """Row t: the mean of rows t-days .. t-1 (0 before `days` rows exist): what is known before day t."""
    out = np.zeros_like(x)
    csum = np.cumsum(x, axis=0)
    out[days:] = (csum[days - 1:-1] - np.vstack([np.zeros((1, x.shape[1])), csum[:-days - 1]])) / days
    return out


def planted_effect(idio: np.ndarray, other: np.ndarray, strength: float, effect: str = "momentum") -> dict:
    """The lean added to each day's idiosyncratic return, from what happened before that day.

    `idio`: the idiosyncratic innovations [days, tickers]; `other`: the rest of each stock's return
    (drift, market and sector), so the regime is read from the volatility of the whole return, the
    quantity a model sees as `vol_20d`. Returns the lean and its inputs: `trailing` (the trailing
    20-day idiosyncratic mean), `vol` (the trailing 20-day volatility of the whole return), `sign`
    (+1 momentum, -1 reversal) and `threshold`.

    The regime threshold is the 70th percentile of `vol` over the whole market (REGIME_QUANTILE): the
    turbulent 30 % reverse, and their larger moves offset the calm 70 %'s momentum in a linear fit,
    so what there is to find is in the interaction (at 48 x 2,520, strength 0.08: the oracle's Rank
    IC +0.115, a linear fit of the true inputs -0.025, the past 20-day return +0.014; a median
    threshold left the linear fit a third of the oracle's)."""
    if effect not in EFFECTS:
        raise UsageError(f"synthetic effect {effect!r} is not one of: {', '.join(EFFECTS)}")
    trailing = _trailing(idio)
    whole = idio + other
    vol = np.sqrt(np.maximum(_trailing(whole**2) - _trailing(whole) ** 2, 0.0))
    sign = np.ones_like(idio)
    threshold = None
    if effect == "regime":
        known = vol[LEAN_DAYS:]  # days with a full trailing window
        threshold = float(np.quantile(known, REGIME_QUANTILE)) if known.size else 0.0
        sign = np.where(vol > threshold, -1.0, 1.0)
    lean = strength * sign * trailing * LEAN_DAYS / np.sqrt(LEAN_DAYS)
    return {"lean": lean, "trailing": trailing, "vol": vol, "sign": sign, "threshold": threshold}


def _factors(n_tickers: int, n_days: int, seed: int) -> dict:
    """Everything random about the market but its planted effect (the same draws for every effect)."""
    rng = np.random.default_rng(seed)
    market = _garch_vols(rng, n_days, 1, np.array([0.011]), _student_t(rng, 4.0, (n_days, 1)))
    sectors = _garch_vols(rng, n_days, N_SECTORS, np.full(N_SECTORS, 0.006), _student_t(rng, 4.0, (n_days, N_SECTORS)))
    idio_vol = rng.uniform(0.008, 0.022, n_tickers)
    idio = _garch_vols(rng, n_days, n_tickers, idio_vol, _student_t(rng, 4.0, (n_days, n_tickers)))
    sector_of = rng.integers(0, N_SECTORS, n_tickers)
    beta = rng.normal(1.0, 0.3, n_tickers).clip(0.2, 2.0)
    drift = rng.normal(0.0003, 0.0002, n_tickers)
    return {"rng": rng, "idio": idio, "idio_vol": idio_vol,
            "other": drift + beta * market + sectors[:, sector_of]}  # drift, market and sector [days, tickers]


def synthetic_truth(n_tickers: int = 64, n_days: int = 2520, seed: int = 0, momentum: float = 0.03,
                    effect: str = "momentum") -> dict:
    """The planted effect of `synthetic_market(n_tickers, n_days, seed, momentum=..., effect=...)`
    and its inputs, per (day, ticker) (see `planted_effect`), with `ret`, the daily log returns."""
    f = _factors(n_tickers, n_days, seed)
    got = planted_effect(f["idio"], f["other"], momentum, effect)
    return {**got, "ret": f["other"] + (f["idio"] + got["lean"])}


def synthetic_market(n_tickers: int = 64, n_days: int = 2520, seed: int = 0, start: str = "2000-01-03",
                     momentum: float = 0.03, effect: str = "momentum") -> pd.DataFrame:
    """Long table of daily OHLCV bars for `n_tickers` over `n_days` business days."""
    if n_tickers < 1 or n_days < 2:
        raise UsageError(f"synthetic market needs >= 1 ticker and >= 2 days, got {n_tickers} x {n_days}")
    f = _factors(n_tickers, n_days, seed)
    rng, idio_vol = f["rng"], f["idio_vol"]
    lean = planted_effect(f["idio"], f["other"], momentum, effect)["lean"]
    ret = f["other"] + (f["idio"] + lean)  # daily log returns [days, tickers], summed as they always were

    close = 100.0 * rng.uniform(0.2, 5.0, n_tickers) * np.exp(np.cumsum(ret, axis=0))
    prev_close = np.vstack([close[:1] * np.exp(-ret[:1]), close[:-1]])
    gap = ret * rng.uniform(0.1, 0.4, (n_days, n_tickers))  # part of the move happens overnight
    open_ = prev_close * np.exp(gap)
    spread = np.abs(_student_t(rng, 4.0, (n_days, n_tickers))) * idio_vol * 0.6
    high = np.maximum(open_, close) * np.exp(spread * rng.uniform(0.3, 1.0, (n_days, n_tickers)))
    low = np.minimum(open_, close) * np.exp(-spread * rng.uniform(0.3, 1.0, (n_days, n_tickers)))
    base_volume = rng.lognormal(14.0, 1.0, n_tickers)
    volume = np.round(base_volume * np.exp(0.4 * rng.standard_normal((n_days, n_tickers)) + 25.0 * np.abs(ret)))

    dates = pd.bdate_range(start, periods=n_days)
    tickers = [f"SYN{i:03d}" for i in range(n_tickers)]
    frame = pd.DataFrame({
        "date": np.repeat(dates.values, n_tickers),
        "ticker": np.tile(tickers, n_days),
        "open": open_.ravel(), "high": high.ravel(), "low": low.ravel(), "close": close.ravel(),
        "volume": volume.ravel(),
    })
    regime = "" if effect == "momentum" else f", effect={effect}"  # the default keeps its old label
    frame.attrs["source"] = f"synthetic(seed={seed}, tickers={n_tickers}, days={n_days}{regime})"
    frame.attrs["synthetic"] = True
    return frame
