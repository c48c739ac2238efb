"""Fetch daily bars with yfinance into a per-ticker parquet cache, resumably and honestly.

- Batches of tickers go to the downloader with bounded concurrency (a thread pool).
- Network errors and rate limits are retried with exponential backoff and jitter; a batch that
  keeps failing marks its tickers failed, with the reason, and the rest of the fetch goes on.
- Each ticker ends ok, empty (Yahoo has no rows: delisted or unknown) or failed (with reason).
- Cache: `<cache>/prices/<SYMBOL>.parquet` plus `<cache>/metadata.json`, both written atomically
  after every batch, so an interrupted fetch keeps everything it finished. A rerun fetches only
  tickers that are missing, failed, empty, or whose cached range does not cover the request and are
  older than `max_age_hours` (`refresh=True` forces all).
- Bars are validated (trainers.market.validate) before they are written.

The downloader is injected: `downloader(tickers, start, end) -> DataFrame` shaped like
`yfinance.download(..., group_by="ticker")` (columns (ticker, field)); `frame.attrs["errors"]` may
carry per-ticker error messages. Tests pass a fake; `yfinance_downloader` is the real one.
"""

from __future__ import annotations

import ast
import datetime as dt
import fcntl
import json
import logging
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
from tqdm import tqdm

from trainers.errors import UsageError
from trainers.market.symbols import SYMBOL_HINT, check_symbols, is_symbol
from trainers.market.validate import validate_bars
from trainers.runtime.files import atomic_write, atomic_write_json

Downloader = Callable[[list[str], str, str], pd.DataFrame]
FIELDS = ("open", "high", "low", "close", "volume")


def _is_rate_limit(message: str) -> bool:
    m = message.lower()
    return "ratelimit" in m.replace(" ", "") or "too many requests" in m or "429" in m


# What a transient failure looks like in yfinance 1.x's error messages (the repr of the exception
# its download caught): the network, timeouts, the server. Retried with backoff; anything else
# (delisted, no data, unknown symbol) is the ticker's answer and is not.
_TRANSIENT = ("connectionerror", "connection reset", "connection refused", "connection aborted", "timeout",
              "timed out", "could not resolve", "temporary failure", "network is unreachable", "max retries",
              "curl: (", "sslerror", "ssl:", "remotedisconnected", "proxyerror", "http error 5", "500 server",
              "502", "503", "504", "name or service not known")


_NO_DATA = ("delisted", "no price data", "no data found", "not found", "pricesmissing", "tzmissing", "no timezone")


def is_no_data(message: str) -> bool:
    """Yahoo's answer that the symbol has no rows (delisted, unknown, no data in the range)."""
    m = message.lower()
    return any(k in m for k in _NO_DATA)


def is_transient(message: str) -> bool:
    m = message.lower()
    return _is_rate_limit(m) or any(k in m for k in _TRANSIENT)


class _YahooErrors(logging.Handler):
    """yfinance >= 1.0 no longer fills `yfinance.shared._ERRORS`: `download()` logs each failure on
    the `yfinance` logger as `['AAPL', 'MSFT']: <repr of the exception>`. Collect those records."""

    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.errors: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        m = re.match(r"^(\[.*?\]):\s*(.+)$", record.getMessage(), re.S)
        if not m:
            return
        try:
            symbols = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):
            return
        for symbol in symbols if isinstance(symbols, list) else []:
            self.errors[str(symbol).upper()] = m.group(2).strip()


def yfinance_downloader(tickers: list[str], start: str, end: str) -> pd.DataFrame:
    """The real client: split- and dividend-adjusted daily bars (auto_adjust=True); each ticker's
    error, as yfinance reports it, in `frame.attrs["errors"]`."""
    import yfinance as yf

    collector = _YahooErrors()
    logger = logging.getLogger("yfinance")
    logger.addHandler(collector)
    try:
        frame = yf.download(tickers, start=start, end=end, interval="1d", auto_adjust=True, actions=False,
                            group_by="ticker", threads=False, progress=False, multi_level_index=True, timeout=30)
    finally:
        logger.removeHandler(collector)
    if frame is None:
        frame = pd.DataFrame()
    wanted = {t.upper(): t for t in tickers}  # batches run in threads: keep this batch's tickers only
    frame.attrs["errors"] = {wanted[t]: e for t, e in collector.errors.items() if t in wanted}
    return frame


def split_download(frame: pd.DataFrame, tickers: list[str]) -> dict[str, pd.DataFrame | None]:
    """yfinance-shaped frame -> {ticker: bars with date + FIELDS, or None when it has no rows}.

    Accepts columns (ticker, field) [group_by="ticker"], (field, ticker) [the default], or flat
    fields for a single ticker."""
    out: dict[str, pd.DataFrame | None] = {}
    if frame is None or frame.empty:
        return {t: None for t in tickers}
    cols = frame.columns
    for t in tickers:
        if isinstance(cols, pd.MultiIndex):
            if t in cols.get_level_values(0):
                sub = frame[t]
            elif t in cols.get_level_values(1):
                sub = frame.xs(t, axis=1, level=1)
            else:
                out[t] = None
                continue
        elif len(tickers) == 1:
            sub = frame
        else:
            out[t] = None
            continue
        sub = sub.rename(columns=lambda c: str(c).strip().lower().replace("adj close", "adj_close"))
        if not set(FIELDS) <= set(sub.columns):
            out[t] = None
            continue
        sub = sub[list(FIELDS)].dropna(how="all")
        if sub.empty:
            out[t] = None
            continue
        idx = pd.DatetimeIndex(sub.index)
        if idx.tz is not None:
            idx = idx.tz_localize(None)
        bars = sub.reset_index(drop=True)
        bars.insert(0, "date", idx.normalize())
        out[t] = bars.astype({f: "float64" for f in FIELDS})
    return out


@dataclass
class FetchSettings:
    start: str
    end: str
    batch_size: int = 50
    max_workers: int = 4
    retries: int = 4
    backoff_s: float = 2.0
    max_age_hours: float = 20.0
    min_rows: int = 252
    refresh: bool = False


@dataclass
class FetchReport:
    outcomes: dict[str, dict] = field(default_factory=dict)  # ticker -> {status, reason?, rows, ...}
    fetched: int = 0
    cached: int = 0
    failed: int = 0
    empty: int = 0
    excluded: int = 0
    rows: int = 0
    seconds: float = 0.0
    attempts: int = 0

    def count(self, outcome: dict) -> None:
        """One ticker's outcome, by its status (`ok`: fetched, with its rows; failed, empty or excluded)."""
        if outcome["status"] == "ok":
            self.fetched += 1
            self.rows += int(outcome["rows"])
        elif outcome["status"] in ("failed", "empty", "excluded"):
            setattr(self, outcome["status"], getattr(self, outcome["status"]) + 1)
        else:
            raise ValueError(f"unknown fetch status {outcome['status']!r}")

    def summary(self) -> str:
        return (f"fetched {self.fetched}, cached {self.cached}, empty {self.empty}, failed {self.failed}, "
                f"excluded by validation {self.excluded}; {self.rows:,} rows in {self.seconds:.1f} s")


def years_ago(years: float, today: dt.date | None = None) -> str:
    today = today or dt.date.today()
    return (pd.Timestamp(today) - pd.DateOffset(days=int(round(years * 365.25)))).strftime("%Y-%m-%d")


class PriceCache:
    """`<root>/prices/<SYMBOL>.parquet` + `<root>/metadata.json`.

    Provenance belongs to each record, not to the container: every ticker's index entry carries the
    source it came from (`yfinance`, `synthetic (...)`, `file:/path`), and so does its parquet file
    (schema metadata). A read checks the two agree, so bars written by a fill that was killed before
    the index caught up are never read under another source's label. A cache holds one source unless
    a fill is told to mix (`--mix-sources`); a run reports every source it read.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.prices = self.root / "prices"

    def path(self, ticker: str) -> Path:
        if not is_symbol(ticker):  # a symbol becomes a file name: never build a path from other text
            raise UsageError(f"{ticker!r} is not a symbol; {SYMBOL_HINT}")
        return self.prices / f"{ticker}.parquet"

    def metadata(self) -> dict:
        p = self.root / "metadata.json"
        if not p.exists():
            return {"tickers": {}}
        try:
            meta = json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise UsageError(f"{p} is unreadable ({exc}); fetch into a new --cache-dir (this one is left as it is)") \
                from None
        if not isinstance(meta, dict) or not isinstance(meta.get("tickers"), dict):
            raise UsageError(f"{p} is not a price-cache index; fetch into a new --cache-dir")
        return meta

    def write_metadata(self, meta: dict) -> None:
        meta["sources"] = self.sources(meta)
        atomic_write_json(self.root / "metadata.json", meta)

    @staticmethod
    def sources(meta: dict) -> dict[str, int]:
        """{source label: tickers} over the usable entries."""
        out: dict[str, int] = {}
        for entry in meta.get("tickers", {}).values():
            if entry.get("status") == "ok":
                label = entry.get("source") or meta.get("source") or "unknown"  # (older caches: one label)
                out[label] = out.get(label, 0) + 1
        return out

    def check_single_source(self, meta: dict, source: str, mix: bool) -> None:
        """Refuse to add `source` to a cache that holds another one, unless mixing was asked for."""
        others = sorted(label for label in self.sources(meta) if label != source)
        if others and not mix:
            raise UsageError(f"--cache-dir {self.root} holds prices from {', '.join(others)}; filling it from "
                             f"{source} would mix sources in one cache. Use another --cache-dir, or "
                             f"--mix-sources to keep both (each ticker keeps its own label)")

    def write_bars(self, ticker: str, bars: pd.DataFrame, source: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(bars, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"trainers_source": source.encode()})
        atomic_write(self.path(ticker), lambda f: pq.write_table(table, f))

    def file_source(self, ticker: str) -> str | None:
        import pyarrow.parquet as pq

        md = pq.read_schema(self.path(ticker)).metadata or {}
        value = md.get(b"trainers_source")
        return value.decode() if value is not None else None

    def read(self, tickers: list[str] | None = None, warn: Callable[[str], None] = print) -> pd.DataFrame:
        """The cached long table for `tickers` (default: every ticker whose status is ok). Each
        ticker's file must carry the source its entry names; one that does not is left out, named."""
        meta = self.metadata()
        entries = meta.get("tickers", {})
        ok = [t for t, m in entries.items() if m.get("status") == "ok" and is_symbol(t)]
        wanted = ok if tickers is None else [t for t in tickers if t in ok]
        read_sources: dict[str, int] = {}
        kept = []
        for t in sorted(wanted):
            try:
                on_disk = self.file_source(t)
            except OSError as exc:
                warn(f"warning: {t}: {self.path(t)} is unreadable ({exc}); left out (refetch it with --refresh)")
                continue
            label = entries[t].get("source") or meta.get("source") or "unknown"
            if on_disk is not None and on_disk != label:
                warn(f"warning: {t}: the file holds {on_disk} prices but the index says {label} (an interrupted "
                     f"fill?); left out (refetch it with --refresh)")
                continue
            kept.append(t)
            read_sources[label] = read_sources.get(label, 0) + 1
        if not kept:
            frame = pd.DataFrame(columns=["date", "ticker", *FIELDS])
            frame.attrs["sources"] = {}
            return frame
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [pq.read_table(self.path(t)) for t in kept]  # one Arrow concat, one conversion
        frame = pa.concat_tables([t.replace_schema_metadata(None) for t in tables]).to_pandas()
        codes = np.repeat(np.arange(len(kept)), [t.num_rows for t in tables])
        frame.insert(1, "ticker", pd.Categorical.from_codes(codes, categories=kept))
        frame.attrs["sources"] = read_sources
        return frame

    @contextmanager
    def lock(self):
        """One writer per cache at a time (other ranks/processes wait, then find it fresh)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".fetch.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _is_fresh(entry: dict | None, s: FetchSettings, now: dt.datetime) -> bool:
    if not entry or entry.get("status") != "ok" or s.refresh:
        return False
    if entry.get("requested_start", "9999") > s.start:
        return False
    if entry.get("requested_end", "") >= s.end:
        return True
    fetched = dt.datetime.fromisoformat(entry["fetched_at"])
    return (now - fetched).total_seconds() < s.max_age_hours * 3600


YFINANCE = "yfinance"


def fetch_prices(tickers: list[str], cache: PriceCache, settings: FetchSettings, downloader: Downloader,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
                 progress: bool = True, log: Callable[[str], None] = print, mix_sources: bool = False) -> FetchReport:
    s = settings
    if s.batch_size < 1 or s.max_workers < 1 or s.retries < 0:
        raise UsageError("--batch-size and --max-workers must be >= 1, --retries >= 0")
    check_symbols(tickers, "tickers to fetch")
    rng = rng or random.Random()
    started = time.monotonic()
    report = FetchReport()
    with cache.lock():
        meta = cache.metadata()
        cache.check_single_source(meta, YFINANCE, mix_sources)
        meta.setdefault("source", YFINANCE)
        meta.setdefault("adjusted", True)  # split- and dividend-adjusted (auto_adjust=True)
        entries = meta.setdefault("tickers", {})
        t_now = now()
        todo = []
        for t in tickers:
            if _is_fresh(entries.get(t), s, t_now) and entries[t].get("source", YFINANCE) == YFINANCE \
                    and cache.path(t).exists():
                report.cached += 1
                report.rows += int(entries[t].get("rows", 0))
                report.outcomes[t] = dict(entries[t], cached=True)
            else:
                todo.append(t)
        batches = [todo[i:i + s.batch_size] for i in range(0, len(todo), s.batch_size)]
        lock = threading.Lock()
        bar = tqdm(total=len(tickers), initial=report.cached, disable=not progress, desc="fetch", unit="ticker")

        def record(ticker: str, outcome: dict) -> None:
            outcome["fetched_at"], outcome["source"] = now().isoformat(), YFINANCE
            outcome["requested_start"], outcome["requested_end"] = s.start, s.end
            entries[ticker] = outcome
            report.outcomes[ticker] = outcome

        def run_batch(batch: list[str]) -> None:
            pending = list(batch)
            last_error = ""
            for attempt in range(s.retries + 1):
                if attempt:
                    delay = s.backoff_s * 2 ** (attempt - 1) * (1 + rng.random())  # exponential + jitter
                    sleep(delay)
                with lock:
                    report.attempts += 1
                try:
                    frame = downloader(pending, s.start, s.end)
                except Exception as exc:  # network, HTTP, rate limit: all retried, reason kept
                    last_error = f"{type(exc).__name__}: {exc}"
                    continue
                errors = dict(getattr(frame, "attrs", {}).get("errors", {}) or {})
                parts = split_download(frame, pending)
                retry = []
                with lock:
                    for t in pending:
                        bars, err = parts.get(t), errors.get(t, "")
                        if bars is None and err and is_transient(err):
                            retry.append(t)  # rate limit or network: again, after a backoff
                            last_error = err
                            continue
                        outcome, clean = bars_outcome(bars, err, s.min_rows)
                        if clean is not None:
                            cache.write_bars(t, clean, YFINANCE)
                        record(t, outcome)
                        report.count(outcome)
                    meta["updated_at"] = now().isoformat()
                    cache.write_metadata(meta)
                    bar.update(len(pending) - len(retry))
                pending = retry
                if not pending:
                    return
            with lock:
                for t in pending:
                    record(t, {"status": "failed", "reason": last_error or "unknown error", "rows": 0})
                    report.count(entries[t])
                meta["updated_at"] = now().isoformat()
                cache.write_metadata(meta)
                bar.update(len(pending))

        try:
            with ThreadPoolExecutor(max_workers=s.max_workers) as pool:
                for future in as_completed([pool.submit(run_batch, b) for b in batches]):
                    future.result()
        finally:
            bar.close()
    report.seconds = time.monotonic() - started
    log(f"fetch: {report.summary()}")
    usable = report.fetched + report.cached
    if tickers and usable == 0:
        reasons = sorted({o.get("reason", "") for o in report.outcomes.values() if o.get("reason")})[:3]
        raise UsageError(f"no ticker could be fetched ({len(tickers)} tried; e.g. {'; '.join(reasons)}). "
                         f"Offline, train with --source synthetic or --source file:PATH")
    return report


def bars_outcome(bars: pd.DataFrame | None, error: str, min_rows: int) -> tuple[dict, pd.DataFrame | None]:
    """A ticker's index entry (before its provenance) from what came back for it, and its validated bars when
    they are usable (`ok`): none with an error (`failed`) or without one (`empty`: no data for the range), or
    bars that fail validation (`excluded`)."""
    if bars is None:
        return {"status": "failed" if error and not is_no_data(error) else "empty",
                "reason": error or "no rows returned", "rows": 0}, None
    clean, checks = validate_bars(bars, min_rows)
    if checks["excluded"]:
        return {"status": "excluded", "reason": checks["reason"], "rows": 0, "validation": checks}, None
    return {"status": "ok", "rows": int(len(clean)), "validation": checks,
            "first_date": clean["date"].min().strftime("%Y-%m-%d"),
            "last_date": clean["date"].max().strftime("%Y-%m-%d")}, clean


def fill_cache(frame: pd.DataFrame, cache: PriceCache, source_label: str, min_rows: int,
               now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc), mix_sources: bool = False,
               batch: int = 50) -> FetchReport:
    """Write a long table (synthetic stand-in or a user's file) into the cache, validated per ticker,
    each ticker labelled with `source_label`. Entries already there are kept; the index is written
    atomically after every `batch` tickers, so a kill loses at most one batch of index updates (and
    the files written meanwhile carry their own label, so they are never read as another source)."""
    started = time.monotonic()
    report = FetchReport()
    check_symbols(sorted(frame["ticker"].astype(str).unique()), f"tickers from {source_label}")
    with cache.lock():
        meta = cache.metadata()
        cache.check_single_source(meta, source_label, mix_sources)
        meta.setdefault("source", source_label)
        entries = meta.setdefault("tickers", {})
        for i, (ticker, bars) in enumerate(frame.groupby("ticker", sort=True, observed=True)):
            entry, clean = bars_outcome(bars.drop(columns="ticker"), "", min_rows)
            if clean is not None:
                cache.write_bars(ticker, clean, source_label)
                entry["fetched_at"] = now().isoformat()
            entries[ticker] = report.outcomes[ticker] = dict(entry, source=source_label)
            report.count(entry)
            if (i + 1) % batch == 0:
                meta["updated_at"] = now().isoformat()
                cache.write_metadata(meta)
        meta["updated_at"] = now().isoformat()
        cache.write_metadata(meta)
    report.seconds = time.monotonic() - started
    return report
