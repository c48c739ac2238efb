"""The ticker universe: the shipped S&P 500 list, a user's list, or a file of symbols.

Symbols are kept in yfinance spelling (class shares with '-': BRK-B, BF-B). Loading rejects
duplicates and malformed symbols with a message naming them, instead of downloading a ticker twice
(which doubled dates in the code this replaces) or asking Yahoo for a name it does not know.

A current-constituents list has survivorship bias: companies that left the index (bankrupt,
acquired, shrunk) are missing from the past, which flatters any backtest over history.
`sp500-pit` is every symbol the membership history holds (trainers.market.pit); the forecaster
then uses each one only on the dates it was a member.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pandas as pd

from trainers.errors import UsageError
from trainers.market.symbols import check_symbols, parse_symbols, read_symbols_file

UNIVERSE_COLUMNS = ("symbol", "name", "gics_sector", "added", "snapshot_date")
UNIVERSES = ("sp500", "sp500-pit")


def validate_symbols(symbols: list[str], where: str) -> list[str]:
    check_symbols(symbols, where)
    seen, dups = set(), []
    for s in symbols:
        if s in seen and s not in dups:
            dups.append(s)
        seen.add(s)
    if dups:
        raise UsageError(f"{where}: duplicate symbol(s) {', '.join(dups[:10])}; each ticker may appear once")
    if not symbols:
        raise UsageError(f"{where}: no symbols")
    return symbols


def validate_universe(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    missing = [c for c in UNIVERSE_COLUMNS if c not in frame.columns]
    if missing:
        raise UsageError(f"{where}: missing column(s) {', '.join(missing)}")
    validate_symbols(frame["symbol"].tolist(), where)
    return frame


def shipped_universe_path(name: str = "sp500") -> Path:
    return Path(str(resources.files("trainers.market").joinpath(f"{name}.csv")))


def load_universe(name: str = "sp500", path: Path | None = None) -> pd.DataFrame:
    if name not in UNIVERSES:
        raise UsageError(f"--universe {name!r} is not one of: {', '.join(UNIVERSES)}")
    if name == "sp500-pit" and path is None:
        from trainers.market.pit import load_history

        spells = load_history().groupby("symbol", sort=True)
        return pd.DataFrame({"symbol": list(spells.groups), "name": spells["name"].last().tolist(),
                             "gics_sector": "", "added": spells["added"].min().dt.strftime("%Y-%m-%d").tolist(),
                             "snapshot_date": spells["snapshot_date"].last().tolist()})[list(UNIVERSE_COLUMNS)]
    path = path or shipped_universe_path(name)
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    return validate_universe(frame, str(path))


def parse_tickers(text: str, where: str = "--tickers") -> list[str]:
    return parse_symbols(text, where)  # an empty list is refused: it must never quietly mean "all"


def read_tickers_file(path: str) -> list[str]:
    """One symbol per line (or comma separated); '#' starts a comment. A CSV with a `symbol` column
    works too."""
    return read_symbols_file(path)


def resolve_tickers(tickers: str | None, tickers_file: str | None, universe: str) -> list[str]:
    """--tickers beats --tickers-file beats --universe."""
    if tickers is not None and tickers_file is not None:
        raise UsageError("give --tickers or --tickers-file, not both")
    if tickers is not None:
        return parse_tickers(tickers)
    if tickers_file is not None:
        return read_tickers_file(tickers_file)
    return load_universe(universe)["symbol"].tolist()
