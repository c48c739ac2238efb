"""Checks on daily bars before anything trains: every problem is counted, reported and removed.

Per ticker: duplicate dates (the later row is kept), non-positive or NaN prices, bars whose high/low
do not contain open and close (a column the table lacks altogether, as in a close-only file, is
not checked: it is absent, not bad), runs of >= ZERO_VOLUME_RUN days without volume (a halted or stale
feed), one-day spikes that jump and revert by more than JUMP_FACTOR (bad prints), and tickers with
fewer than `min_rows` bars left (excluded). One-day jumps beyond JUMP_FACTOR that do not revert are
kept (they may be real) but counted.

Vectorised over the whole long table (500 tickers x 25 years in about a second); a one-ticker
frame goes through the same code.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ZERO_VOLUME_RUN = 5
JUMP_FACTOR = 2.0  # close more than doubles or halves in a day
CHECKS = ("duplicate_dates", "bad_prices", "inconsistent_ohlc", "zero_volume_run_rows", "spike_rows",
          "large_jumps_kept")


def _same_ticker_as_previous(codes: np.ndarray) -> np.ndarray:
    same = np.zeros(len(codes), dtype=bool)
    same[1:] = codes[1:] == codes[:-1]
    return same


def _validate(df: pd.DataFrame, codes: np.ndarray, n_tickers: int, min_rows: int):
    """df sorted by (ticker, date) with integer ticker `codes`. Returns (keep mask, per-ticker counts)."""
    counts = {}

    def count(mask: np.ndarray, name: str) -> None:
        counts[name] = np.bincount(codes[mask], minlength=n_tickers)

    keep = np.ones(len(df), dtype=bool)
    dates = df["date"].to_numpy()
    # duplicate (ticker, date): the next row has the same key -> drop this one (keep the later)
    dup = np.zeros(len(df), dtype=bool)
    dup[:-1] = (codes[:-1] == codes[1:]) & (dates[:-1] == dates[1:])
    count(dup, "duplicate_dates")
    keep &= ~dup

    prices = df[["open", "high", "low", "close"]].to_numpy(dtype=np.float64)
    present = np.isfinite(prices).any(axis=0)  # a column with no value at all is absent, not bad
    present[3] = True  # close is never optional
    checked = prices[:, present]
    bad = ~(np.isfinite(checked).all(axis=1) & (checked > 0).all(axis=1))
    count(bad & keep, "bad_prices")
    keep &= ~bad

    o, h, lo, c = prices.T
    with np.errstate(invalid="ignore"):
        # fmax/fmin: an absent open leaves the check of close against high and low
        inconsistent = (h * (1 + 1e-6) < np.fmax(o, c)) | (lo * (1 - 1e-6) > np.fmin(o, c))
    count(inconsistent & keep, "inconsistent_ohlc")
    keep &= ~inconsistent

    def on_kept(arr: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.flatnonzero(k)
        return idx, arr[idx], _same_ticker_as_previous(codes[idx])

    raw_volume = df["volume"].to_numpy(dtype=np.float64)
    volume = np.nan_to_num(raw_volume)
    idx, vol, same = on_kept(volume, keep)
    zero = (vol <= 0) & bool(np.isfinite(raw_volume).any())  # no volume column: nothing to check
    new_run = np.ones(len(idx), dtype=bool)
    new_run[1:] = (zero[1:] != zero[:-1]) | ~same[1:]
    run_id = np.cumsum(new_run) - 1
    run_len = np.bincount(run_id)[run_id] if len(idx) else run_id
    long_zero = np.zeros(len(df), dtype=bool)
    long_zero[idx[zero & (run_len >= ZERO_VOLUME_RUN)]] = True
    count(long_zero, "zero_volume_run_rows")
    keep &= ~long_zero

    limit = np.log(JUMP_FACTOR)
    idx, close, same = on_kept(c, keep)
    r = np.zeros(len(idx))
    r[1:] = np.diff(np.log(close))
    r[~same] = 0.0  # no return across tickers
    up_then_back = np.zeros(len(idx), dtype=bool)
    if len(idx) >= 2:
        jump_in, jump_out = r[:-1], r[1:]  # for row i: r[i] into it, r[i+1] out of it
        up_then_back[:-1] = (np.abs(jump_in) > limit) & (np.abs(jump_out) > limit) & (np.sign(jump_in) != np.sign(jump_out))
    spike = np.zeros(len(df), dtype=bool)
    spike[idx[up_then_back]] = True
    count(spike, "spike_rows")
    keep &= ~spike

    idx, close, same = on_kept(c, keep)
    r = np.zeros(len(idx))
    r[1:] = np.diff(np.log(close))
    jumps = np.zeros(len(df), dtype=bool)
    jumps[idx[same & (np.abs(r) > limit)]] = True
    count(jumps, "large_jumps_kept")

    counts["rows_in"] = np.bincount(codes, minlength=n_tickers)
    counts["rows_out"] = np.bincount(codes[keep], minlength=n_tickers)
    excluded = counts["rows_out"] < min_rows
    keep &= ~excluded[codes]
    return keep, counts, excluded


def validate_long_table(frame: pd.DataFrame, min_rows: int) -> tuple[pd.DataFrame, dict]:
    """Validate every ticker of a long table; returns the clean table and a summary report."""
    columns = list(frame.columns)
    df = frame
    if not (df["ticker"].is_monotonic_increasing and _dates_sorted_within(df)):
        df = df.sort_values(["ticker", "date"], kind="stable")
    codes, names = pd.factorize(df["ticker"], sort=True)
    keep, counts, excluded = _validate(df, codes, len(names), min_rows)
    summary = {k: int(counts[k].sum()) for k in CHECKS}
    summary["tickers_in"] = len(names)
    summary["excluded"] = {str(names[i]): f"only {counts['rows_out'][i]} valid bars, need {min_rows}"
                           for i in np.flatnonzero(excluded)}
    summary["rows_dropped"] = int(len(df) - keep.sum())
    dropping = [k for k in CHECKS if k != "large_jumps_kept"]  # per ticker, the rows each check removed
    summary["dropped_by_ticker"] = {str(names[i]): {k: int(counts[k][i]) for k in dropping if counts[k][i]}
                                    for i in range(len(names)) if any(counts[k][i] for k in dropping)}
    summary["columns_absent"] = [c for c in ("open", "high", "low", "volume") if not df[c].notna().any()]
    return df[keep].reset_index(drop=True)[columns], summary


def _dates_sorted_within(df: pd.DataFrame) -> bool:
    codes = pd.factorize(df["ticker"])[0]
    d = df["date"].to_numpy()
    same = codes[1:] == codes[:-1]
    return bool(np.all(d[1:][same] >= d[:-1][same]))


def validate_bars(bars: pd.DataFrame, min_rows: int) -> tuple[pd.DataFrame, dict]:
    """One ticker's bars (date, open, high, low, close, volume) -> (clean bars, report)."""
    df = bars.sort_values("date", kind="stable").reset_index(drop=True)
    codes = np.zeros(len(df), dtype=np.int64)
    keep, counts, excluded = _validate(df, codes, 1, min_rows)
    report: dict = {k: int(counts[k][0]) for k in CHECKS}
    report["rows_in"] = int(len(df))
    report["rows_out"] = int(counts["rows_out"][0])
    report["excluded"] = bool(excluded[0])
    if report["excluded"]:
        report["reason"] = f"only {report['rows_out']} valid bars, need {min_rows}"
        return df.iloc[0:0], report
    return df[keep].reset_index(drop=True), report
