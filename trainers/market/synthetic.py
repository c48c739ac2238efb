"""A deterministic synthetic market: market factor, sectors, fat tails, volatility clustering.

Labelled synthetic everywhere it goes (tickers are SYN000..., the frame's attrs say so, results
record it). It has a weak, real momentum effect in idiosyncratic returns so a model has something
to find; its size is a parameter, and the default is small, as in real markets.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainers.errors import UsageError

N_SECTORS = 11


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


def synthetic_market(n_tickers: int = 64, n_days: int = 2520, seed: int = 0, start: str = "2000-01-03",
                     momentum: float = 0.03) -> pd.DataFrame:
    """Long table of daily OHLCV bars for `n_tickers` over `n_days` business days."""
    if n_tickers < 1 or n_days < 2:
        raise UsageError(f"synthetic market needs >= 1 ticker and >= 2 days, got {n_tickers} x {n_days}")
    rng = np.random.default_rng(seed)
    market = _garch_vols(rng, n_days, 1, np.array([0.011]), _student_t(rng, 4.0, (n_days, 1)))
    sectors = _garch_vols(rng, n_days, N_SECTORS, np.full(N_SECTORS, 0.006), _student_t(rng, 4.0, (n_days, N_SECTORS)))
    idio_vol = rng.uniform(0.008, 0.022, n_tickers)
    idio = _garch_vols(rng, n_days, n_tickers, idio_vol, _student_t(rng, 4.0, (n_days, n_tickers)))
    # Momentum: today's idiosyncratic return leans on the trailing 20-day idiosyncratic mean.
    trailing = np.zeros_like(idio)
    csum = np.cumsum(idio, axis=0)
    trailing[20:] = (csum[19:-1] - np.vstack([np.zeros((1, n_tickers)), csum[:-21]])) / 20.0
    idio = idio + momentum * trailing * 20.0 / np.sqrt(20.0)

    sector_of = rng.integers(0, N_SECTORS, n_tickers)
    beta = rng.normal(1.0, 0.3, n_tickers).clip(0.2, 2.0)
    drift = rng.normal(0.0003, 0.0002, n_tickers)
    ret = drift + beta * market + sectors[:, sector_of] + idio  # daily log returns [days, tickers]

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
    frame.attrs["source"] = f"synthetic(seed={seed}, tickers={n_tickers}, days={n_days})"
    frame.attrs["synthetic"] = True
    return frame
