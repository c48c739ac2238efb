"""The trading agent's market: stocks with a full price history, causal technical indicators
(the FinRL / Zou et al. set plus volatility) and chronological splits with an embargo.

Every indicator at day t uses bars 0..t only (EMAs and Wilder smoothing run forward in time), so a
change in a future bar never changes a past feature (tests/ppo/test_ppo_env.py checks it). The
z-scores use statistics of the training period only. Decisions are made at day t's close from the
window of feature rows t-window+1..t and filled at that close (the FinRL convention).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainers.errors import UsageError
from trainers.market.panel import Panel, price_fingerprint
from trainers.market.windows import CLIP, plan_splits

FEATURES = ("ret_1d", "macd", "rsi_14", "cci_20", "adx_14", "vol_20d")
WARMUP = 40  # dates dropped at the start: MACD's EMA(26) + signal and ADX's double smoothing settle
TRADING_DAYS = 252


def _ema(x: pd.DataFrame, span: int) -> pd.DataFrame:
    return x.ewm(span=span, adjust=False).mean()


def _wilder(x: pd.DataFrame, n: int) -> pd.DataFrame:
    return x.ewm(alpha=1.0 / n, adjust=False).mean()


def _rolling_mean_abs_dev(x: np.ndarray, n: int) -> np.ndarray:
    """Mean absolute deviation from the mean over rows t-n+1..t (NaN for the first n-1 rows)."""
    out = np.full_like(x, np.nan)
    if len(x) >= n:
        windows = np.lib.stride_tricks.sliding_window_view(x, n, axis=0)  # [T-n+1, N, n]
        out[n - 1:] = np.abs(windows - windows.mean(-1, keepdims=True)).mean(-1)
    return out


def indicators(close: np.ndarray, high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """[dates, stocks, len(FEATURES)] raw (unnormalised) indicators; row t uses rows 0..t only."""
    c, h, lo = (pd.DataFrame(a) for a in (close, high, low))
    ret = np.log(c / c.shift(1))
    macd = (_ema(c, 12) - _ema(c, 26)) / c  # scale-free: a fraction of the price
    delta = c.diff()
    gain, loss = _wilder(delta.clip(lower=0), 14), _wilder((-delta).clip(lower=0), 14)
    rsi = 1.0 - 1.0 / (1.0 + gain / loss.replace(0.0, np.nan))  # RSI / 100
    rsi = rsi.where(loss > 0, 1.0)  # no losses in 14 days: RSI 100
    typical = (h + lo + c) / 3.0
    mean_tp = typical.rolling(20).mean()
    mean_dev = pd.DataFrame(_rolling_mean_abs_dev(typical.to_numpy(), 20))
    cci = (typical - mean_tp) / (0.015 * mean_dev.replace(0.0, np.nan)) / 100.0
    prev_close = c.shift(1)
    true_range = pd.DataFrame(np.fmax.reduce([(h - lo).to_numpy(), (h - prev_close).abs().to_numpy(),
                                              (lo - prev_close).abs().to_numpy()]))
    up, down = h.diff(), -lo.diff()
    plus_dm = up.where((up > down) & (up > 0), 0.0)
    minus_dm = down.where((down > up) & (down > 0), 0.0)
    atr = _wilder(true_range, 14)
    plus_di, minus_di = _wilder(plus_dm, 14) / atr, _wilder(minus_dm, 14) / atr
    dx = (plus_di - minus_di).abs() / (plus_di + minus_di).replace(0.0, np.nan)
    adx = _wilder(dx.fillna(0.0), 14)
    vol = ret.rolling(20).std(ddof=0)
    feats = np.stack([f.to_numpy(dtype=np.float64) for f in (ret, macd, rsi, cci, adx, vol)], axis=-1)
    feats[~np.isfinite(feats)] = np.nan
    return feats


@dataclass
class TradingData:
    """What the environment and the evaluation need, as NumPy arrays (moved to tensors by env.py)."""

    close: np.ndarray  # [dates, stocks] float64
    features: np.ndarray  # [dates, stocks, F] float32, z-scored with training statistics, clipped
    dates: list[str]
    tickers: list[str]
    splits: dict[str, tuple[int, int]]  # decision dates [start, stop) per split
    embargo: int
    feature_mean: list[float]
    feature_std: list[float]
    fingerprint: str  # the chosen stocks' bars as read (price_fingerprint): what a resume or evaluate checks

    @property
    def n_stocks(self) -> int:
        return self.close.shape[1]

    def text(self, source: str) -> str:
        """The log's line of what a run trades."""
        return (f"{source}; {self.n_stocks} stocks x {len(self.dates)} dates; decision dates train/val/test "
                f"{'/'.join(str(b - a) for a, b in self.splits.values())}; embargo {self.embargo} dates")

    def describe(self) -> dict:
        return {"tickers": self.tickers, "n_stocks": self.n_stocks, "n_dates": len(self.dates),
                "first_date": self.dates[0], "last_date": self.dates[-1], "embargo_dates": self.embargo,
                "decision_dates": {s: [self.dates[a], self.dates[b - 1], b - a] for s, (a, b) in self.splits.items()},
                "features": list(FEATURES), "feature_mean": self.feature_mean, "feature_std": self.feature_std}


MAX_FILLED_GAP = 5  # dates in a row a stock may miss (bad bars the validation dropped) and still be traded


def fill_short_gaps(panel: Panel) -> dict[str, int]:
    """Bars a stock misses for at most MAX_FILLED_GAP dates in a row, between two bars it has (a bad print
    the validation dropped), take its last close (high = low = close, no volume): in place. Returns the
    bars filled per ticker. A longer gap, or one at either end of its history, stays: not a stock then."""
    filled = {}
    for j, ticker in enumerate(panel.tickers):
        have = np.isfinite(panel.close[:, j]) & (panel.close[:, j] > 0)
        rows = np.flatnonzero(have)
        if len(rows) < 2:
            continue
        gaps = [(a, b) for a, b in zip(rows[:-1], rows[1:]) if 1 < b - a <= MAX_FILLED_GAP + 1]
        for a, b in gaps:
            for col in (panel.close, panel.high, panel.low):
                col[a + 1:b, j] = panel.close[a, j]
            panel.volume[a + 1:b, j] = 0.0
        if gaps:
            filled[ticker] = int(sum(b - a - 1 for a, b in gaps))
    return filled


def ranges_from_close(panel: Panel) -> list[str]:
    """A stock with no high or no low at all (a close-only file, or its close-only tickers) takes its close for
    both, in place: the CCI's typical price and the ADX's ranges are then computed from closes (their usual
    close-only forms) instead of the stock being dropped as incomplete. The tickers so filled."""
    filled = []
    for j, ticker in enumerate(panel.tickers):
        no_range = [col for col in (panel.high, panel.low) if not np.isfinite(col[:, j]).any()]
        for col in no_range:
            col[:, j] = panel.close[:, j]
        if no_range:
            filled.append(ticker)
    return filled


def pick_stocks(panel: Panel, num_stocks: int, dropped_by_ticker: dict | None = None) -> tuple[list[int], dict]:
    """Stocks with a bar on every date (the environment trades every stock every day; short gaps filled:
    fill_short_gaps), the `num_stocks` with the highest mean dollar volume over the first 70 % of dates (a
    size proxy that leaves the evaluation periods out). `dropped_by_ticker`: the validation's per-ticker
    counts of bad rows, to name them when they are why too few stocks are left."""
    from_close = ranges_from_close(panel)
    filled = fill_short_gaps(panel)
    complete = np.isfinite(panel.close).all(0) & np.isfinite(panel.high).all(0) & np.isfinite(panel.low).all(0)
    complete &= (panel.close > 0).all(0)
    candidates = np.flatnonzero(complete)
    if len(candidates) < num_stocks:  # a portfolio of fewer stocks than asked is another experiment: said, not run
        incomplete = [t for t, ok in zip(panel.tickers, complete) if not ok]
        bad = {t: sum(dropped_by_ticker[t].values()) for t in incomplete if t in (dropped_by_ticker or {})}
        cause = (f"{len(bad)} of them lost bars to validation (bad prices dropped: "
                 f"{', '.join(f'{t} {n}' for t, n in list(bad.items())[:5])}{' ...' if len(bad) > 5 else ''}), "
                 f"more than {MAX_FILLED_GAP} dates in a row or at an end of their history: clean those rows"
                 if bad else "more tickers, or a shorter --start/--end range")
        missing = (f"{len(incomplete)} ticker(s) miss dates ({', '.join(incomplete[:5])}"
                   f"{' ...' if len(incomplete) > 5 else ''}): {cause}" if incomplete else "more tickers")
        fewer = f", or --num-stocks {len(candidates)}" if len(candidates) >= 2 else ""
        raise UsageError(f"--num-stocks {num_stocks}: the data holds {len(candidates)} stock(s) with a bar on every "
                         f"date; {missing}{fewer}")
    head = max(1, int(len(panel.dates) * 0.7))
    dollar_volume = np.nanmean(panel.close[:head] * np.nan_to_num(panel.volume[:head]), axis=0)
    order = candidates[np.argsort(-dollar_volume[candidates], kind="stable")]
    chosen = sorted(order[:num_stocks].tolist())
    return chosen, {"complete_stocks": int(len(candidates)), "dropped_incomplete": int((~complete).sum()),
                    "bars_filled": {t: n for t, n in filled.items() if panel.tickers.index(t) in chosen},
                    "high_low_from_close": [t for t in from_close if panel.tickers.index(t) in chosen]}


def build_trading_data(panel: Panel, num_stocks: int, window: int, val_frac: float, test_frac: float,
                       min_split_dates: int, dropped_by_ticker: dict | None = None) -> tuple[TradingData, dict]:
    if num_stocks < 2:
        raise UsageError(f"--num-stocks {num_stocks} must be >= 2: a portfolio needs at least 2 stocks")
    chosen, info = pick_stocks(panel, num_stocks, dropped_by_ticker)
    close, high, low = (a[:, chosen] for a in (panel.close, panel.high, panel.low))
    tickers, all_dates = [panel.tickers[i] for i in chosen], [d.strftime("%Y-%m-%d") for d in panel.dates]
    fingerprint = price_fingerprint(tickers, all_dates, close, high, low)
    feats = indicators(close, high, low)[WARMUP:]
    close = close[WARMUP:]
    dates = all_dates[WARMUP:]
    if len(dates) <= window + 2:
        raise UsageError(f"--window {window} is longer than the data ({len(dates)} dates after a {WARMUP}-day "
                         f"indicator warm-up); use a shorter window or more history")
    plan = plan_splits(len(dates), window, 1, val_frac, test_frac, min_split_dates)  # horizon 1: next close
    train_start, train_stop = plan.ranges["train"]
    if window > train_stop - train_start:
        raise UsageError(f"--window {window} is longer than the training period ({train_stop - train_start} "
                         f"decision dates); use a shorter window or more history")
    # z-scores from the rows the training period reads (its windows end at its last decision date)
    train_rows = feats[:train_stop].reshape(-1, len(FEATURES))
    mean, std = np.nanmean(train_rows, axis=0), np.nanstd(train_rows, axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    norm = np.nan_to_num(np.clip((feats - mean) / std, -CLIP, CLIP), nan=0.0).astype(np.float32)
    data = TradingData(close=close.astype(np.float64), features=norm, dates=dates, tickers=tickers,
                       splits=dict(plan.ranges), embargo=plan.embargo, feature_mean=mean.tolist(),
                       feature_std=std.tolist(), fingerprint=fingerprint)
    return data, info
