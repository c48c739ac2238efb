"""Each symbol's base bars, on its own calendar, from the market sources.

Daily bars come through trainers.market.sources (synthetic, the yfinance cache, yfinance); a user
file may hold daily, hourly or minute bars (`date` with a time of day), read here because the
market package's long table keeps dates only. Every symbol keeps its own timestamps: stocks trade
on weekdays, crypto seven days a week, and nothing is forced onto a shared date index.

The base interval is the shortest gap between two bars of a symbol (so no two bars overlap, which
the no-look-ahead argument in trainers.lstm.features relies on); every symbol of a job must have
the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from trainers.errors import UsageError
from trainers.lstm.config import LstmConfig, Timeframe, check_symbols, parse_symbols, read_symbols_file, to_symbol
from trainers.market.panel import COLUMNS
from trainers.market.sources import DataRequest, load_source
from trainers.market.universe import load_universe
from trainers.market.validate import validate_long_table

WEEKDAYS, SEVEN_DAYS = "weekdays", "7 days"


@dataclass
class Bars:
    symbol: str
    ts: np.ndarray  # datetime64[ns], strictly increasing: each bar's open time
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray
    base: Timeframe
    calendar: str  # WEEKDAYS or SEVEN_DAYS

    def __len__(self) -> int:
        return len(self.ts)

    def replace_after(self, t: int, rng: np.random.Generator) -> "Bars":
        """A copy whose bars after index t are replaced by other, valid prices (for the look-ahead test)."""
        out = Bars(self.symbol, self.ts.copy(), self.open.copy(), self.high.copy(), self.low.copy(),
                   self.close.copy(), self.volume.copy(), self.base, self.calendar)
        n = len(self) - t - 1
        if n > 0:
            scale = np.exp(rng.normal(0, 0.2, n))
            for a in (out.open, out.high, out.low, out.close):
                a[t + 1:] *= scale
            out.high[t + 1:] *= 1.05
            out.low[t + 1:] *= 0.95
            out.volume[t + 1:] = rng.uniform(1e3, 1e7, n)
        return out


def base_timeframe(ts: np.ndarray, symbol: str) -> Timeframe:
    """The shortest gap between bars as a timeframe: 1d, Nh or Nm."""
    if len(ts) < 2:
        raise UsageError(f"{symbol}: {len(ts)} bar(s); need a history of many bars")
    gap_min = int(np.diff(ts).min() // np.timedelta64(1, "m"))
    if gap_min >= 1440:
        if gap_min != 1440:
            raise UsageError(f"{symbol}: bars are at least {gap_min / 1440:g} days apart; use daily, hourly or "
                             f"minute bars")
        return Timeframe(1, "d")
    if gap_min < 1:
        raise UsageError(f"{symbol}: two bars less than a minute apart; use minute, hourly or daily bars")
    if 1440 % gap_min:
        raise UsageError(f"{symbol}: bars every {gap_min} minutes do not divide a day; use e.g. 1, 5, 15 or 60 minutes")
    return Timeframe(gap_min // 60, "h") if gap_min % 60 == 0 else Timeframe(gap_min, "m")


def calendar_of(ts: np.ndarray) -> str:
    """7 days when any bar falls on a Saturday or Sunday (crypto), else weekdays (stocks)."""
    weekday = pd.DatetimeIndex(ts).day_of_week
    return SEVEN_DAYS if (weekday >= 5).any() else WEEKDAYS


def read_bars_file(path: str) -> pd.DataFrame:
    """A user's long table (CSV or parquet) with `date` kept to the second (intraday bars)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--source file:{path}: no such file")
    suffix = "".join(p.suffixes[-2:]).lower()
    try:
        if suffix.endswith((".parquet", ".pq")):
            frame = pd.read_parquet(p)
        elif suffix.endswith((".csv", ".csv.gz")):
            frame = pd.read_csv(p)
        else:
            raise UsageError(f"--source file:{path}: unknown format {p.suffix!r}; use .csv, .csv.gz or .parquet")
    except (ValueError, OSError) as exc:
        raise UsageError(f"--source file:{path} could not be read: {str(exc).splitlines()[0]}") from None
    frame = frame.rename(columns={c: str(c).strip().lower() for c in frame.columns})
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise UsageError(f"--source file:{path} lacks column(s) {', '.join(missing)}; need {', '.join(COLUMNS)}")
    out = frame[list(COLUMNS)].copy()
    try:  # offsets -> UTC, naive times taken as UTC; ISO dates with or without a time, else any format
        dates = pd.to_datetime(out["date"], utc=True, format="ISO8601")
    except (ValueError, TypeError):
        try:
            dates = pd.to_datetime(out["date"], utc=True, format="mixed")
        except (ValueError, TypeError) as exc:
            raise UsageError(f"--source file:{path}: unparseable date ({str(exc).splitlines()[0]})") from None
    out["date"] = dates.dt.tz_localize(None)
    out["ticker"] = out["ticker"].astype(str)
    for c in COLUMNS[2:]:
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    return out


def requested_symbols(cfg: LstmConfig) -> list[str] | None:
    """--symbols, --tickers-file, the universe (yfinance) or None (every symbol the source has)."""
    if cfg.symbols:
        return parse_symbols(cfg.symbols)
    if cfg.tickers_file:
        return read_symbols_file(cfg.tickers_file)
    if cfg.source == "yfinance":
        return check_symbols(load_universe(cfg.universe)["symbol"].tolist(), f"--universe {cfg.universe}")
    return None


def _long_table(cfg: LstmConfig, wanted: list[str] | None, log) -> tuple[pd.DataFrame, dict]:
    if cfg.source.startswith("file:"):
        frame = read_bars_file(cfg.source[5:])
        names = {raw: to_symbol(raw) for raw in frame["ticker"].unique()}
        if wanted is None:  # every ticker of the file becomes a folder name: each must be a symbol
            check_symbols(list(names.values()), f"--source {cfg.source}", list(names))
        frame["ticker"] = frame["ticker"].map(names)
        if cfg.start or cfg.end:
            if cfg.start:
                frame = frame[frame["date"] >= pd.Timestamp(cfg.start)]
            if cfg.end:
                frame = frame[frame["date"] < pd.Timestamp(cfg.end)]
        if wanted is not None:
            frame = frame[frame["ticker"].isin(wanted)]
        if frame.empty:
            raise UsageError(f"--source {cfg.source}: no rows for the requested symbols and dates")
        frame, report = validate_long_table(frame, 1)
        return frame, {"source": cfg.source, "synthetic": False, "validation": report}
    request = DataRequest(source=cfg.source, tickers=None if cfg.source == "synthetic" else wanted,
                          cache_dir=cfg.cache_dir, start=cfg.start, end=cfg.end, years=cfg.years, min_rows=1,
                          synthetic_tickers=cfg.synthetic_tickers, synthetic_days=cfg.synthetic_days,
                          synthetic_seed=cfg.data_seed, synthetic_momentum=cfg.synthetic_momentum)
    return load_source(request, log=log)


def load_bars(cfg: LstmConfig, log=print) -> tuple[dict[str, Bars], dict]:
    """{symbol: Bars} in the order asked for (or sorted), and the source's info. Unknown symbols,
    malformed names and mixed bar intervals are refused before anything is written."""
    wanted = requested_symbols(cfg)
    frame, info = _long_table(cfg, wanted, log)
    frame["ticker"] = frame["ticker"].astype(str)
    have = sorted(frame["ticker"].unique().tolist())
    if wanted is None:
        wanted = check_symbols(have, f"--source {cfg.source}")  # names from a file or cache become folders
    unknown = [s for s in wanted if s not in set(have)]
    if unknown:
        sample = ", ".join(have[:8]) + (f" ... ({len(have)} in all)" if len(have) > 8 else "")
        raise UsageError(f"unknown symbol(s) {', '.join(unknown[:10])}: --source {cfg.source} has no bars for "
                         f"them (it has {sample or 'none'})")
    out: dict[str, Bars] = {}
    for symbol, rows in frame.groupby("ticker", sort=False, observed=True):
        if symbol not in wanted:
            continue
        rows = rows.sort_values("date")
        ts = rows["date"].to_numpy(dtype="datetime64[ns]")
        base = base_timeframe(ts, symbol)
        if base.unit == "d":
            ts = pd.DatetimeIndex(ts).normalize().to_numpy()
        cols = {c: rows[c].to_numpy(dtype=np.float64) for c in ("open", "high", "low", "close", "volume")}
        out[symbol] = Bars(symbol, ts, **cols, base=base, calendar=calendar_of(ts))
    bases = {b.base.label for b in out.values()}
    if len(bases) > 1:
        raise UsageError(f"the symbols have different bar intervals ({', '.join(sorted(bases))}); train each "
                         f"interval as its own job")
    info = {k: v for k, v in info.items() if k != "tickers_used"}
    return {s: out[s] for s in wanted}, info
