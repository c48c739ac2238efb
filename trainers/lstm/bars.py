"""Each symbol's base bars, on its own calendar, from the market sources.

Every source goes through trainers.market.sources, as for the forecaster and PPO (its reader, column
names, symbol spelling, validation and provenance): synthetic, the yfinance cache, yfinance (daily),
or a user file of daily, hourly or minute bars (`keep_time`: a file's dates keep their time of day).
A file needs date, ticker and close; open, high, low and volume are used when it has them (the
features that need a missing one are left out, trainers.lstm.features). Every symbol keeps its own
timestamps: stocks trade on weekdays, crypto seven days a week, and nothing is forced onto a shared
date index.

The base interval is the shortest gap between two bars of a symbol (so no two bars overlap, which
the no-look-ahead argument in trainers.lstm.features relies on); every symbol of a job must have
the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainers.errors import UsageError
from trainers.lstm.config import LstmConfig, Timeframe
from trainers.market.sources import DataRequest, load_source
from trainers.market.symbols import parse_symbols, read_symbols_file, unique_symbols
from trainers.market.universe import load_universe

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
    member: np.ndarray | None = None  # --universe sp500-pit: bars at which the symbol was in the index

    def __len__(self) -> int:
        return len(self.ts)

    def absent_columns(self) -> list[str]:
        """Columns with no value at all (a close-only file has no open, high, low or volume)."""
        return [c for c in ("open", "high", "low", "volume") if not np.isfinite(getattr(self, c)).any()]

    def replace_after(self, t: int, rng: np.random.Generator) -> "Bars":
        """A copy whose bars after index t are replaced by other, valid prices (for the look-ahead test)."""
        out = Bars(self.symbol, self.ts.copy(), self.open.copy(), self.high.copy(), self.low.copy(),
                   self.close.copy(), self.volume.copy(), self.base, self.calendar, self.member)
        n = len(self) - t - 1
        if n > 0:
            scale = np.exp(rng.normal(0, 0.2, n))
            for a in (out.open, out.high, out.low, out.close):
                a[t + 1:] *= scale
            out.high[t + 1:] *= 1.05
            out.low[t + 1:] *= 0.95
            out.volume[t + 1:] = rng.uniform(1e3, 1e7, n)
        return out


def only_bars(bars: Bars, lo: int, hi: int, member: np.ndarray) -> Bars:
    """Bars lo..hi-1, with the membership of each."""
    return Bars(bars.symbol, bars.ts[lo:hi], bars.open[lo:hi], bars.high[lo:hi], bars.low[lo:hi], bars.close[lo:hi],
                bars.volume[lo:hi], bars.base, bars.calendar, member)


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


def named_symbols(cfg: LstmConfig) -> bool:
    """The user named the symbols (--symbols, --tickers-file): each one must train, or the job is refused."""
    return cfg.symbols is not None or cfg.tickers_file is not None


def requested_symbols(cfg: LstmConfig) -> list[str] | None:
    """--symbols, --tickers-file, the universe (yfinance: sp500 today's members, sp500-pit every member
    of the history over the dates) or None (every symbol the source has)."""
    if cfg.symbols is not None:
        return parse_symbols(cfg.symbols)
    if cfg.tickers_file is not None:
        return read_symbols_file(cfg.tickers_file)
    if cfg.source == "yfinance" and cfg.universe == "sp500-pit":
        from trainers.market.pit import load_history, members_between

        return members_between(load_history(), cfg.start, cfg.end)
    if cfg.source == "yfinance":
        return unique_symbols(load_universe(cfg.universe)["symbol"].tolist(), f"--universe {cfg.universe}")
    return None


def data_request(cfg: LstmConfig, wanted: list[str] | None) -> DataRequest:
    """The market sources' request for this job. A file keeps its bars' times of day (hourly, minute
    bars) and is read whole unless --start/--end say otherwise (--years is for yfinance and the cache);
    the synthetic market names its own symbols (filtered after)."""
    file = cfg.source.startswith("file:")
    return DataRequest(source=cfg.source, tickers=None if cfg.source == "synthetic" else wanted,
                       cache_dir=cfg.cache_dir, start=cfg.start, end=cfg.end, years=None if file else cfg.years,
                       min_rows=1, synthetic_tickers=cfg.synthetic_tickers, synthetic_days=cfg.synthetic_days,
                       synthetic_seed=cfg.data_seed, synthetic_momentum=cfg.synthetic_momentum, keep_time=file)


def failed_validation(report: dict, wanted: list[str] | None) -> list[str]:
    """"SYMBOL (why)" for each symbol (of `wanted`; None: all) that validation left without a bar: the checks
    that dropped its rows, so a user sees what to fix in the file."""
    out = []
    for s, reason in (report.get("excluded") or {}).items():
        if wanted is None or s in wanted:
            checks = (report.get("dropped_by_ticker") or {}).get(s, {})
            dropped = ", ".join(f"{n} {check}" for check, n in checks.items())
            out.append(f"{s} ({reason}{'; rows dropped: ' + dropped if dropped else ''})")
    return out


def load_bars(cfg: LstmConfig, log=print) -> tuple[dict[str, Bars], dict]:
    """{symbol: Bars} in the order asked for (or sorted), and the source's info. Unknown symbols,
    malformed names and mixed bar intervals are refused before anything is written. Columns a source
    lacks (a close-only file) come as all-NaN arrays: the features that need them are left out."""
    wanted = requested_symbols(cfg)
    frame, info = load_source(data_request(cfg, wanted), log=log)
    frame["ticker"] = frame["ticker"].astype(str)
    have = sorted(frame["ticker"].unique().tolist())
    invalid = failed_validation(info.get("validation") or {}, wanted)
    if wanted is None:
        wanted = unique_symbols(have, f"--source {cfg.source}")  # names from a source become folders
    if invalid and named_symbols(cfg):  # named, so it must train: say why it cannot (not "no bars")
        raise UsageError(f"symbol(s) with no valid bar in --source {cfg.source}: {'; '.join(invalid[:5])}; fix "
                         f"the data or leave them out of --symbols / --tickers-file")
    if invalid:  # every symbol of the source: the others train, and these are named, not dropped silently
        log(f"warning: {len(invalid)} symbol(s) of --source {cfg.source} left out, no valid bar: "
            f"{'; '.join(invalid[:10])}{' ...' if len(invalid) > 10 else ''}")
        info["symbols_failed_validation"] = invalid
        wanted = [s for s in wanted if s not in set(info["validation"]["excluded"])]
    unknown = [s for s in wanted if s not in set(have)]
    if unknown and not named_symbols(cfg):  # a universe's members Yahoo no longer serves: reported, not fatal
        log(f"warning: {len(unknown)} symbol(s) of --universe {cfg.universe} have no bars: {', '.join(unknown[:10])}"
            f"{' ...' if len(unknown) > 10 else ''}")
        info["symbols_without_bars"] = unknown
        wanted = [s for s in wanted if s not in set(unknown)]
    elif unknown:
        sample = ", ".join(have[:8]) + (f" ... ({len(have)} in all)" if len(have) > 8 else "")
        asked = "" if cfg.source == "synthetic" else " of those asked for"  # the others were read for these only
        raise UsageError(f"unknown symbol(s) {', '.join(unknown[:10])}: --source {cfg.source} has no bars for "
                         f"them (it has {sample or 'none'}{asked})")
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
    bases: dict[str, list[str]] = {}
    for s, b in out.items():
        bases.setdefault(b.base.label, []).append(s)
    if len(bases) > 1:  # each interval with the symbols that have it: the user sees which to move out
        which = "; ".join(f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                          for label, names in sorted(bases.items()))
        raise UsageError(f"the symbols have different bar intervals ({', '.join(sorted(bases))}): {which}; train "
                         f"each interval as its own job")
    info = {k: v for k, v in info.items() if k != "tickers_used"}
    return {s: out[s] for s in wanted}, info
