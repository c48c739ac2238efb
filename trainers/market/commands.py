"""The bodies of `trainers fetch-sp500` and `trainers refresh-universe` (their flags: trainers.market.cli)."""

from __future__ import annotations

import argparse
import io
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd

from trainers.errors import UsageError
from trainers.market.fetch import (
    FetchSettings,
    PriceCache,
    fetch_prices,
    fill_cache,
    yfinance_downloader,
)
from trainers.market.sources import DataRequest, check_source, read_user_file
from trainers.market.symbols import to_yfinance_symbol
from trainers.market.synthetic import synthetic_market
from trainers.market.universe import UNIVERSE_COLUMNS, resolve_tickers, shipped_universe_path, validate_universe
from trainers.runtime.config import SYNTHETIC_MAX_CELLS, check_folder_writable, check_product
from trainers.runtime.files import atomic_write


def run_fetch(args: argparse.Namespace, downloader=yfinance_downloader) -> dict:
    check_source(args.source)
    if args.source == "cache":
        raise UsageError("--source cache reads the cache; fetch-sp500 fills it: use yfinance, synthetic or file:PATH")
    check_folder_writable(Path(args.cache_dir), "--cache-dir")
    cache = PriceCache(Path(args.cache_dir))
    if args.source == "yfinance":
        tickers = resolve_tickers(args.tickers, args.tickers_file, args.universe)
        start, end = DataRequest(start=args.start, end=args.end, years=args.years).date_range()
        settings = FetchSettings(start=start, end=end, batch_size=args.batch_size, max_workers=args.max_workers,
                                 retries=args.retries, min_rows=args.min_history_days, refresh=args.refresh)
        report = fetch_prices(tickers, cache, settings, downloader, progress=not args.no_progress,
                              mix_sources=args.mix_sources)
    else:
        if args.source == "synthetic":
            check_product(args, ("synthetic_tickers", "synthetic_days"), SYNTHETIC_MAX_CELLS, "prices to generate")
            frame = synthetic_market(args.synthetic_tickers, args.synthetic_days, seed=args.data_seed)
            label = frame.attrs["source"]
        else:
            frame = read_user_file(args.source[5:])
            label = f"file:{Path(args.source[5:]).resolve()}"
        report = fill_cache(frame, cache, label, args.min_history_days, mix_sources=args.mix_sources)
        print(f"fetch: {report.summary()} (source {label})")
    return {"cache_dir": str(cache.root), "sources": PriceCache.sources(cache.metadata()), "fetched": report.fetched, "cached": report.cached, "failed": report.failed,
            "empty": report.empty, "excluded": report.excluded, "rows": report.rows,
            "seconds": round(report.seconds, 2),
            "not_ok": {t: o.get("reason") for t, o in report.outcomes.items() if o.get("status") != "ok"}}


def refresh_universe(url: str, output: Path, timeout: float = 15.0) -> dict:
    """Read the current constituents table (symbol, security, GICS sector, date added) and write it,
    validated, in our CSV format. Offline: say so and leave the existing file as it is."""
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "trainers-kit/0.1"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            html = response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"cannot read {url} ({exc}); no network? keeping {output} as it is") from None
    tables = pd.read_html(io.StringIO(html), match="Symbol")
    table = next((t for t in tables if {"Symbol", "GICS Sector"} <= set(map(str, t.columns))), None)
    if table is None:
        raise UsageError(f"{url} has no table with Symbol and GICS Sector columns; keeping {output} as it is")
    snapshot = pd.Timestamp.now(tz="UTC").strftime("%Y-%m-%d")
    added = pd.to_datetime(table.get("Date added", pd.Series([""] * len(table))), errors="coerce")
    frame = pd.DataFrame({
        "symbol": table["Symbol"].map(to_yfinance_symbol),
        "name": table.get("Security", table["Symbol"]).astype(str),
        "gics_sector": table["GICS Sector"].astype(str),
        "added": added.dt.strftime("%Y-%m-%d").fillna(""),
        "snapshot_date": snapshot,
    })[list(UNIVERSE_COLUMNS)].sort_values("symbol")
    validate_universe(frame, url)
    atomic_write(output, lambda f: frame.to_csv(f, index=False), mode="w")
    return {"output": str(output), "symbols": len(frame), "snapshot_date": snapshot}


def run_refresh(args: argparse.Namespace) -> dict:
    return refresh_universe(args.url, Path(args.output) if args.output else shipped_universe_path("sp500"))
