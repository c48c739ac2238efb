"""`trainers fetch-sp500` and `trainers refresh-universe`: flags only (the work: trainers.market.commands)."""

from __future__ import annotations

import argparse
import json

from trainers.runtime.config import MAX_YEARS, SYNTHETIC_MAX_DAYS, date_text, number

WIKIPEDIA_SP500 = "https://en.wikipedia.org/wiki/List_of_S%26P_500_companies"


def _fetch(args) -> int:
    from trainers.market.commands import run_fetch

    print(json.dumps(run_fetch(args), indent=2, default=str))
    return 0


def _refresh(args) -> int:
    from trainers.market.commands import run_refresh

    print(json.dumps(run_refresh(args), indent=2, default=str))
    return 0


def add_fetch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", default="yfinance",
                   help="yfinance (default), synthetic (a stand-in market written to the cache) or file:PATH")
    p.add_argument("--universe", default="sp500", help="ticker universe when no --tickers are given (default: sp500)")
    p.add_argument("--tickers", default=None, help="comma-separated symbols, e.g. AAPL,MSFT,BRK-B")
    p.add_argument("--tickers-file", default=None, help="file of symbols, one per line")
    p.add_argument("--years", type=number(float, gt=0, max=MAX_YEARS), default=25.0,
                   help="history when --start is not given (default: 25)")
    p.add_argument("--start", type=date_text, default=None, help="first date YYYY-MM-DD")
    p.add_argument("--end", type=date_text, default=None, help="end date YYYY-MM-DD, exclusive (default: today)")
    p.add_argument("--cache-dir", default="cache/sp500", help="parquet cache folder (default: cache/sp500)")
    p.add_argument("--refresh", action="store_true", help="download every ticker again, even when cached")
    p.add_argument("--mix-sources", action="store_true",
                   help="let a cache that holds prices from another source take these too (each ticker keeps its label)")
    p.add_argument("--batch-size", type=number(int, min=1), default=50, help="tickers per download request (default: 50)")
    p.add_argument("--max-workers", type=number(int, min=1), default=4, help="requests in flight at once (default: 4)")
    p.add_argument("--retries", type=number(int, min=0), default=4, help="retries per batch with exponential backoff (default: 4)")
    p.add_argument("--min-history-days", type=number(int, min=1), default=252, help="exclude tickers with fewer valid bars")
    p.add_argument("--synthetic-tickers", type=number(int, min=1), default=500, help="synthetic stand-in: tickers (default: 500)")
    p.add_argument("--synthetic-days", type=number(int, min=1, max=SYNTHETIC_MAX_DAYS), default=6300, help="synthetic stand-in: days (default: 6300, 25 y)")
    p.add_argument("--data-seed", type=number(int, min=0), default=0, help="synthetic stand-in: seed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_refresh_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=WIKIPEDIA_SP500, help="page with the constituents table")
    p.add_argument("--output", default=None, help="CSV to write (default: the shipped trainers/market/sp500.csv)")




def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fetch-sp500", help="fill the price cache: yfinance (resumable), a synthetic stand-in or a file")
    add_fetch_args(p)
    p.set_defaults(func=_fetch)
    p = sub.add_parser("refresh-universe", help="re-read the S&P 500 constituents with GICS sectors (needs network)")
    add_refresh_args(p)
    p.set_defaults(func=_refresh)
