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

import datetime as dt
import fcntl
import json
import random
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
from trainers.market.validate import validate_bars
from trainers.runtime.files import atomic_write, atomic_write_json

Downloader = Callable[[list[str], str, str], pd.DataFrame]
FIELDS = ("open", "high", "low", "close", "volume")


class RateLimited(Exception):
    """The data provider asked us to slow down."""


def _is_rate_limit(message: str) -> bool:
    m = message.lower()
    return "ratelimit" in m.replace(" ", "") or "too many requests" in m or "429" in m


def yfinance_downloader(tickers: list[str], start: str, end: str) -> pd.DataFrame:
    """The real client: split- and dividend-adjusted daily bars (auto_adjust=True)."""
    import yfinance as yf
    import yfinance.shared as shared

    frame = yf.download(tickers, start=start, end=end, interval="1d", auto_adjust=True, actions=False,
                        group_by="ticker", threads=False, progress=False, multi_level_index=True, timeout=30)
    errors = dict(getattr(shared, "_ERRORS", {}) or {})
    if frame is None:
        frame = pd.DataFrame()
    frame.attrs["errors"] = {t: str(e) for t, e in errors.items() if t in tickers}
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

    def summary(self) -> str:
        return (f"fetched {self.fetched}, cached {self.cached}, empty {self.empty}, failed {self.failed}, "
                f"excluded by validation {self.excluded}; {self.rows:,} rows in {self.seconds:.1f} s")


def years_ago(years: float, today: dt.date | None = None) -> str:
    today = today or dt.date.today()
    return (pd.Timestamp(today) - pd.DateOffset(days=int(round(years * 365.25)))).strftime("%Y-%m-%d")


class PriceCache:
    """`<root>/prices/<SYMBOL>.parquet` + `<root>/metadata.json`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.prices = self.root / "prices"

    def path(self, ticker: str) -> Path:
        return self.prices / f"{ticker}.parquet"

    def metadata(self) -> dict:
        p = self.root / "metadata.json"
        if not p.exists():
            return {"source": "yfinance", "adjusted": True, "tickers": {}}
        return json.loads(p.read_text())

    def write_metadata(self, meta: dict) -> None:
        atomic_write_json(self.root / "metadata.json", meta)

    def write_bars(self, ticker: str, bars: pd.DataFrame) -> None:
        atomic_write(self.path(ticker), lambda f: bars.to_parquet(f, index=False))

    def read(self, tickers: list[str] | None = None) -> pd.DataFrame:
        """The cached long table for `tickers` (default: every ticker whose status is ok)."""
        meta = self.metadata()
        ok = [t for t, m in meta.get("tickers", {}).items() if m.get("status") == "ok"]
        wanted = ok if tickers is None else [t for t in tickers if t in ok]
        if not wanted:
            return pd.DataFrame(columns=["date", "ticker", *FIELDS])
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        wanted = sorted(wanted)
        tables = [pq.read_table(self.path(t)) for t in wanted]  # one Arrow concat, one conversion
        frame = pa.concat_tables(tables).to_pandas()
        codes = np.repeat(np.arange(len(wanted)), [t.num_rows for t in tables])
        frame.insert(1, "ticker", pd.Categorical.from_codes(codes, categories=wanted))
        return frame

    @contextmanager
    def lock(self):
        """One fetcher per cache at a time (other ranks/processes wait, then find it fresh)."""
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


def fetch_prices(tickers: list[str], cache: PriceCache, settings: FetchSettings, downloader: Downloader,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
                 progress: bool = True, log: Callable[[str], None] = print) -> FetchReport:
    s = settings
    if s.batch_size < 1 or s.max_workers < 1 or s.retries < 0:
        raise UsageError("--batch-size and --max-workers must be >= 1, --retries >= 0")
    rng = rng or random.Random()
    started = time.monotonic()
    report = FetchReport()
    with cache.lock():
        meta = cache.metadata()
        entries = meta.setdefault("tickers", {})
        t_now = now()
        todo = []
        for t in tickers:
            if _is_fresh(entries.get(t), s, t_now) and cache.path(t).exists():
                report.cached += 1
                report.rows += int(entries[t].get("rows", 0))
                report.outcomes[t] = dict(entries[t], cached=True)
            else:
                todo.append(t)
        batches = [todo[i:i + s.batch_size] for i in range(0, len(todo), s.batch_size)]
        lock = threading.Lock()
        bar = tqdm(total=len(tickers), initial=report.cached, disable=not progress, desc="fetch", unit="ticker")

        def record(ticker: str, outcome: dict) -> None:
            outcome["fetched_at"] = now().isoformat()
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
                        if bars is None and err and _is_rate_limit(err):
                            retry.append(t)
                            last_error = err
                            continue
                        if bars is None:
                            status = "failed" if err else "empty"
                            record(t, {"status": status, "reason": err or "no rows returned", "rows": 0})
                            if status == "failed":
                                report.failed += 1
                            else:
                                report.empty += 1
                            continue
                        clean, checks = validate_bars(bars, s.min_rows)
                        if checks["excluded"]:
                            record(t, {"status": "excluded", "reason": checks["reason"], "rows": 0,
                                       "validation": checks})
                            report.excluded += 1
                            continue
                        cache.write_bars(t, clean)
                        record(t, {"status": "ok", "rows": int(len(clean)), "validation": checks,
                                   "first_date": clean["date"].min().strftime("%Y-%m-%d"),
                                   "last_date": clean["date"].max().strftime("%Y-%m-%d")})
                        report.fetched += 1
                        report.rows += int(len(clean))
                    meta["updated_at"] = now().isoformat()
                    cache.write_metadata(meta)
                    bar.update(len(pending) - len(retry))
                pending = retry
                if not pending:
                    return
            with lock:
                for t in pending:
                    record(t, {"status": "failed", "reason": last_error or "unknown error", "rows": 0})
                    report.failed += 1
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


def fill_cache(frame: pd.DataFrame, cache: PriceCache, source_label: str, min_rows: int,
               now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> FetchReport:
    """Write a long table (synthetic stand-in or a user's file) into the cache, validated per ticker.
    The cache's metadata records the source, so a later `--source cache` knows what it reads."""
    started = time.monotonic()
    report = FetchReport()
    with cache.lock():
        meta = {"source": source_label, "adjusted": None, "tickers": {}}
        for ticker, bars in frame.groupby("ticker", sort=True):
            clean, checks = validate_bars(bars.drop(columns="ticker"), min_rows)
            if checks["excluded"]:
                meta["tickers"][ticker] = {"status": "excluded", "reason": checks["reason"], "rows": 0,
                                           "validation": checks}
                report.excluded += 1
                continue
            cache.write_bars(ticker, clean)
            meta["tickers"][ticker] = {"status": "ok", "rows": int(len(clean)), "validation": checks,
                                       "first_date": clean["date"].min().strftime("%Y-%m-%d"),
                                       "last_date": clean["date"].max().strftime("%Y-%m-%d"),
                                       "fetched_at": now().isoformat(), "source": source_label}
            report.fetched += 1
            report.rows += int(len(clean))
        report.outcomes = meta["tickers"]
        meta["updated_at"] = now().isoformat()
        cache.write_metadata(meta)
    report.seconds = time.monotonic() - started
    return report
