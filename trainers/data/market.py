"""The long-table interface every market data source produces and the forecaster consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainers.errors import UsageError

COLUMNS = ("date", "ticker", "open", "high", "low", "close", "volume")
PRICE_COLUMNS = ("open", "high", "low", "close")


def normalise_columns(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    """Lower-case column names; fail with the names of any missing column."""
    renamed = frame.rename(columns={c: str(c).strip().lower() for c in frame.columns})
    missing = [c for c in COLUMNS if c not in renamed.columns]
    if missing:
        raise UsageError(f"{where} lacks column(s) {', '.join(missing)}; need {', '.join(COLUMNS)} "
                         f"(case-insensitive), found {', '.join(map(str, frame.columns))}")
    out = renamed[list(COLUMNS)].copy()
    out["date"] = pd.to_datetime(out["date"]).dt.tz_localize(None).dt.normalize()
    out["ticker"] = out["ticker"].astype(str)
    for c in COLUMNS[2:]:
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    return out


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
    if frame.duplicated(["date", "ticker"]).any():
        dups = frame[frame.duplicated(["date", "ticker"], keep=False)]
        first = dups.iloc[0]
        raise UsageError(f"market data has {len(dups)} rows with a repeated (date, ticker), e.g. "
                         f"{first['ticker']} on {first['date'].date()}; each ticker needs one bar per date")
    dates = pd.DatetimeIndex(sorted(frame["date"].unique()))
    tickers = sorted(frame["ticker"].unique())
    d_idx = dates.get_indexer(frame["date"])
    t_idx = pd.Index(tickers).get_indexer(frame["ticker"])
    arrays = {}
    for col in COLUMNS[2:]:
        a = np.full((len(dates), len(tickers)), np.nan, dtype=np.float64)
        a[d_idx, t_idx] = frame[col].to_numpy()
        arrays[col] = a
    return Panel(dates, tickers, **arrays)
