"""The long-table interface every market data source produces and the forecaster consumes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainers.errors import UsageError

COLUMNS = ("date", "ticker", "open", "high", "low", "close", "volume")
PRICE_COLUMNS = ("open", "high", "low", "close")
OPTIONAL_COLUMNS = ("open", "high", "low", "volume")  # what a close-only table may lack


def normalise_columns(frame: pd.DataFrame, where: str, optional: tuple[str, ...] = (),
                      keep_time: bool = False) -> pd.DataFrame:
    """Lower-case column names; fail with the names of any missing column. Columns named in
    `optional` may be missing: they are added empty (NaN), and whatever needs them is left out later.
    Dates become midnight (daily bars), or with `keep_time` keep their time of day (intraday bars:
    offsets are converted to UTC, times without one are taken as UTC)."""
    names = [str(c).strip().lower() for c in frame.columns]
    clashing = sorted({n for n in names if names.count(n) > 1})
    if clashing:
        raise UsageError(f"{where}: column names that differ only in case or spaces: "
                         + "; ".join(", ".join(repr(str(c)) for c in frame.columns if str(c).strip().lower() == n)
                                     for n in clashing) + "; keep one of each")
    renamed = frame.rename(columns=dict(zip(frame.columns, names)))
    missing = [c for c in COLUMNS if c not in renamed.columns and c not in optional]
    if missing:
        need = [c for c in COLUMNS if c not in optional]
        extra = f" ({', '.join(optional)} optional)" if optional else ""
        raise UsageError(f"{where} lacks column(s) {', '.join(missing)}; need {', '.join(need)}{extra} "
                         f"(case-insensitive), found {', '.join(map(str, frame.columns))}")
    out = renamed.reindex(columns=list(COLUMNS))  # an absent optional column comes back all NaN
    if keep_time:
        out["date"] = _timestamps(out["date"])
    else:
        if not (pd.api.types.is_datetime64_dtype(out["date"]) and out["date"].dt.tz is None):
            out["date"] = pd.to_datetime(out["date"]).dt.tz_localize(None)
        out["date"] = out["date"].dt.normalize()
    blank = out["ticker"].isna() | (out["ticker"].astype(str).str.strip() == "")
    if blank.any():
        rows = np.flatnonzero(blank.to_numpy())
        raise UsageError(f"{where}: {len(rows)} row(s) have no ticker (first: row {int(rows[0]) + 1} of the data, "
                         f"dated {out['date'].iloc[rows[0]]}); give every row a symbol")
    if not isinstance(out["ticker"].dtype, pd.CategoricalDtype):
        out["ticker"] = out["ticker"].astype(str)
    for c in COLUMNS[2:]:
        if out[c].dtype != np.float64:
            out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    return out


def _timestamps(dates: pd.Series) -> pd.Series:
    """Naive UTC timestamps to the second: ISO 8601 with or without a time and offset, else any format
    pandas can read (raises ValueError when none fits)."""
    if pd.api.types.is_datetime64_dtype(dates) and dates.dt.tz is None:
        return dates
    try:
        parsed = pd.to_datetime(dates, utc=True, format="ISO8601")
    except (ValueError, TypeError):
        parsed = pd.to_datetime(dates, utc=True, format="mixed")
    return parsed.dt.tz_localize(None)


@dataclass
class Panel:
    """The long table pivoted to dense [date, ticker] arrays (NaN where a ticker has no bar)."""

    dates: pd.DatetimeIndex
    tickers: list[str]
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.close.shape


def to_panel(frame: pd.DataFrame) -> Panel:
    frame = normalise_columns(frame, "market data")
    d_idx, dates = pd.factorize(frame["date"], sort=True)
    t_idx, tickers = pd.factorize(frame["ticker"], sort=True)  # categorical tickers stay cheap here
    dates, tickers = pd.DatetimeIndex(dates), [str(t) for t in tickers]
    key = d_idx.astype(np.int64) * len(tickers) + t_idx
    per_cell = np.bincount(key, minlength=len(dates) * len(tickers))
    if per_cell.max(initial=0) > 1:
        cell = int(np.argmax(per_cell))
        n_dup = int((per_cell[per_cell > 1]).sum())
        raise UsageError(f"market data has {n_dup} rows with a repeated (date, ticker), e.g. "
                         f"{tickers[cell % len(tickers)]} on {dates[cell // len(tickers)].date()}; "
                         f"each ticker needs one bar per date")
    arrays = {}
    for col in COLUMNS[2:]:
        a = np.full((len(dates), len(tickers)), np.nan, dtype=np.float64)
        a[d_idx, t_idx] = frame[col].to_numpy()
        arrays[col] = a
    return Panel(dates, tickers, **arrays)


def price_fingerprint(tickers: list[str], dates: list[str], *bars: np.ndarray) -> str:
    """SHA-256 of the tickers, dates and bars (float64, as read): a trainer's features, labels and baselines
    derive from them, so a file edited between a run and its resume or evaluation changes it (data.json)."""
    digest = hashlib.sha256(json.dumps([tickers, dates]).encode())
    for bar in bars:
        digest.update(np.ascontiguousarray(bar, dtype=np.float64).tobytes())
    return digest.hexdigest()
