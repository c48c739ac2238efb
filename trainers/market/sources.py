"""Market data sources behind one interface: a `--source` spec in, a validated long table out.

    synthetic      the deterministic synthetic market (labelled synthetic everywhere)
    yfinance       fetch what the cache lacks from Yahoo via yfinance, then read the cache
    cache          read the parquet cache only (no network)
    file:PATH      the user's long-format CSV or parquet (date, ticker, close; open, high, low and
                   volume when it has them: features that need a missing column are left out).
                   Dates are days, or with `keep_time` (the LSTM's intraday bars) timestamps.

Real-data sources are validated (trainers.market.validate) before they reach training; the report
and the exact tickers used go into results.json. Nothing falls back to synthetic data silently.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from trainers.errors import UsageError
from trainers.market.fetch import (
    FetchSettings,
    PriceCache,
    fetch_prices,
    years_ago,
    yfinance_downloader,
)
from trainers.market.panel import OPTIONAL_COLUMNS, normalise_columns
from trainers.market.symbols import check_symbols, to_yfinance_symbol
from trainers.market.synthetic import synthetic_market
from trainers.market.validate import validate_long_table

SOURCES = ("synthetic", "yfinance", "cache", "file:PATH")
DEFAULT_YEARS = 25.0
TRADING_DAYS = 252  # sessions a year of a US exchange (daily bars of yfinance, the cache)
WEEKDAYS_A_YEAR = 365.25 * 5 / 7  # about 261, of which about 9 are exchange holidays


def check_source(source: str) -> None:
    if source in ("synthetic", "yfinance", "cache"):
        return
    if source.startswith("file:") and len(source) > 5:
        return
    raise UsageError(f"--source {source!r} is not one of: {', '.join(SOURCES)}")


@dataclass
class DataRequest:
    source: str = "synthetic"
    tickers: list[str] | None = None  # None: every ticker the source has (synthetic: generated)
    cache_dir: str = "cache/sp500"
    start: str | None = None
    end: str | None = None
    years: float | None = None  # None: 25 years for yfinance, the whole history for a file
    min_rows: int = 252
    synthetic_tickers: int = 64
    synthetic_days: int = 2520
    synthetic_seed: int = 0
    synthetic_momentum: float = 0.03
    keep_time: bool = False  # a file's dates keep their time of day (hourly, minute bars)

    def date_range(self) -> tuple[str, str]:
        end = self.end or (dt.date.today() + dt.timedelta(days=1)).isoformat()  # yfinance's end is exclusive
        start = self.start or years_ago(self.years or DEFAULT_YEARS, dt.date.fromisoformat(end[:10]))
        if start >= end:
            raise UsageError(f"--start {start} must be before --end {end}")
        return start, end


def trading_days(start: str, end: str) -> int:
    """About how many daily bars a US exchange has in [start, end) (the planner's count, before any fetch): the
    weekdays less the year's holidays, pro rata."""
    return round(len(pd.bdate_range(start[:10], end[:10], inclusive="left")) * TRADING_DAYS / WEEKDAYS_A_YEAR)


def pinned_dates(req: DataRequest, saved: dict | None) -> tuple[str | None, str | None]:
    """Real data: the [start, end) a run pins on its first start, so a resume next week reads the same dates
    (`saved`: the run's config.json, None on a first run). A file is used whole unless --start/--end/--years say
    otherwise (its dates do not move), and --years counts back from its last date, not from today. Only the
    request's source and dates are read: a trainer passes the request its options make, and keeps the answer."""
    if req.source == "synthetic":
        return req.start, req.end
    if req.source.startswith("file:") and not (req.start or req.end or req.years):
        return req.start, req.end
    if saved is not None:
        return req.start or saved.get("start"), req.end or saved.get("end")
    if req.source.startswith("file:"):
        return file_date_range(req, read_user_file(req.source[5:]))
    return req.date_range()


def file_date_range(req: DataRequest, frame: pd.DataFrame) -> tuple[str, str]:
    """[start, end) of a file: --years counts back from the file's last date, not from today (a
    file's history does not move)."""
    if req.end is None and len(frame):
        last = (frame["date"].max() + pd.Timedelta(days=1)).strftime("%Y-%m-%d")
        return dataclasses.replace(req, end=last).date_range()
    return req.date_range()


def read_user_file(path: str, keep_time: bool = False) -> pd.DataFrame:
    """A user's long table, columns normalised, tickers spelled like --tickers and checked. Dates are
    midnight, or keep their time of day with `keep_time`."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--source file:{path}: no such file")
    suffix = "".join(p.suffixes[-2:]).lower()
    try:
        if suffix.endswith(".parquet") or suffix.endswith(".pq"):
            frame = pd.read_parquet(p)
        elif suffix.endswith(".csv") or suffix.endswith(".csv.gz"):
            frame = pd.read_csv(p)
        else:
            raise UsageError(f"--source file:{path}: unknown format {p.suffix!r}; use .csv, .csv.gz or .parquet")
    except (ValueError, OSError) as exc:
        raise UsageError(f"--source file:{path} could not be read: {str(exc).splitlines()[0]}") from None
    try:
        frame = normalise_columns(frame, f"--source file:{path}", optional=OPTIONAL_COLUMNS, keep_time=keep_time)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--source file:{path} has unparseable values: {str(exc).splitlines()[0]}") from None
    # the same spelling as --tickers and the universes (BRK.B, brk/b -> BRK-B), so they match
    spelled = {raw: to_yfinance_symbol(raw) for raw in sorted(frame["ticker"].astype(str).unique())}
    check_symbols(list(spelled.values()), f"--source file:{path}", list(spelled))  # named as the file has them
    merged = {}
    for raw, symbol in spelled.items():
        merged.setdefault(symbol, []).append(raw)
    clashes = {symbol: raws for symbol, raws in merged.items() if len(raws) > 1}
    if clashes:  # 'aaa' and 'AAA' would become one series, one of them dropped as "duplicate dates"
        symbol, raws = next(iter(clashes.items()))
        raise UsageError(f"--source file:{path}: tickers {' and '.join(map(repr, raws))} are both {symbol} (symbols "
                         f"are case-insensitive, '.' and '/' read as '-'){f' ({len(clashes)} such symbols)' if len(clashes) > 1 else ''}; "
                         f"keep one spelling per company")
    frame["ticker"] = frame["ticker"].astype(str).map(spelled)
    return frame


def load_source(req: DataRequest, log=print) -> tuple[pd.DataFrame, dict]:
    """(long table, info). info: source label, synthetic flag, tickers used, validation report."""
    check_source(req.source)
    info: dict = {"source": req.source, "synthetic": False}
    if req.source == "synthetic":
        frame = synthetic_market(n_tickers=req.synthetic_tickers, n_days=req.synthetic_days, seed=req.synthetic_seed,
                                 momentum=req.synthetic_momentum)
        info.update(source=frame.attrs["source"], synthetic=True, sources={frame.attrs["source"]: req.synthetic_tickers})
        if req.tickers is not None:
            raise UsageError("--tickers/--tickers-file select real symbols; the synthetic market has its own "
                             "(use --synthetic-tickers N)")
        return frame, info
    if req.source.startswith("file:"):
        frame = read_user_file(req.source[5:], req.keep_time)
        if req.tickers is not None:
            missing = sorted(set(req.tickers) - set(frame["ticker"]))
            if missing and len(missing) == len(set(req.tickers)):  # name them and what the file has
                have = sorted(frame["ticker"].unique())
                raise UsageError(f"--source {req.source} has none of the requested tickers "
                                 f"({', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}); it has "
                                 f"{', '.join(have[:8])}{f' ... ({len(have)} in all)' if len(have) > 8 else ''}")
            if missing:
                log(f"warning: {len(missing)} requested ticker(s) are not in the file: {', '.join(missing[:10])}")
            frame = frame[frame["ticker"].isin(req.tickers)]
        if req.start or req.end or req.years:  # a file's whole history unless told otherwise
            whole = (f"the file holds {frame['date'].min():%Y-%m-%d} .. {frame['date'].max():%Y-%m-%d}"
                     if len(frame) else "the file holds no rows for them")
            start, end = file_date_range(req, frame)
            frame = frame[(frame["date"] >= start) & (frame["date"] < end)]
            if frame.empty:
                raise UsageError(f"--source {req.source}: no rows in [{start}, {end}) for the requested tickers; "
                                 f"{whole}")
        info["sources"] = {f"file:{Path(req.source[5:]).resolve()}": int(frame["ticker"].nunique())}
    else:
        cache = PriceCache(Path(req.cache_dir))
        if req.source == "yfinance":
            if req.tickers is None:
                raise UsageError("--source yfinance needs tickers (--universe, --tickers or --tickers-file)")
            start, end = req.date_range()
            report = fetch_prices(req.tickers, cache, FetchSettings(start=start, end=end, min_rows=req.min_rows),
                                  yfinance_downloader, log=log)
            info["fetch"] = {k: getattr(report, k) for k in ("fetched", "cached", "failed", "empty", "excluded", "rows")}
            info["failed_tickers"] = {t: o.get("reason") for t, o in report.outcomes.items()
                                      if o.get("status") != "ok"}
        meta = cache.metadata()
        if not meta.get("tickers"):
            raise UsageError(f"--cache-dir {req.cache_dir} holds no cached prices; run `trainers fetch-sp500` "
                             f"first (or train with --source synthetic or --source file:PATH)")
        frame = cache.read(req.tickers, warn=log)
        info["sources"] = dict(frame.attrs.get("sources", {}))  # every source this run reads, per ticker count
        info["synthetic"] = any(label.startswith("synthetic") for label in info["sources"])
        if req.start or req.end:
            start, end = req.date_range()
            frame = frame[(frame["date"] >= start) & (frame["date"] < end)]
    if frame.empty:
        raise UsageError(f"--source {req.source}: no rows left for the requested tickers and dates")
    frame, report = validate_long_table(frame, req.min_rows)
    info["validation"] = report
    if frame.empty:
        raise UsageError(f"--source {req.source}: every ticker failed validation "
                         f"(e.g. {list(report['excluded'].items())[:3]})")
    info["tickers_used"] = sorted(frame["ticker"].unique().tolist())
    if req.tickers is not None:
        info["tickers_missing"] = sorted(set(req.tickers) - set(info["tickers_used"]))
    return frame, info


def checked_fingerprint(fingerprint: str, info: dict, source: str) -> str | None:
    """The fingerprint a run records on its first start and checks on a resume or an evaluation (data.json), or
    None where the data is not fingerprinted (`fingerprinted`)."""
    return fingerprint if fingerprinted(info, source) else None


def fingerprinted(info: dict, source: str) -> bool:
    """Whether a run records its data's fingerprint and checks it on a resume or an evaluation (data.json): a
    file or a cache edited in between is refused, not trained or scored on unseen. Not for a synthetic market,
    which its own options make (a resume with other options is refused by the config's check), and whose
    generated floats may differ in a last bit on another machine's math library; not for `yfinance`, which
    fetches what the cache lacks: a run resumed on a fresh machine after its pod was lost fetches again, and
    Yahoo's adjusted closes move with every dividend since (refusing it would lose the run). Not either for a
    cache that Yahoo alone filled (`trainers fetch-sp500`): the deploy trains from one, and on a fresh machine
    its data phase fills it again before the run resumes from the remote. A cache holding a user's file
    (imported) keeps the check. `info`: load_source's."""
    from trainers.market.fetch import YFINANCE

    fetched = set(info.get("sources") or {}) == {YFINANCE}
    return not (info.get("synthetic") or source == "yfinance" or (source == "cache" and fetched))
