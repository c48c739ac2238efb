"""The one symbol grammar, in one place and without pandas (configs import it): every symbol from
every source is checked against it before it is used anywhere, since a symbol becomes a file or
folder name (price cache files, per-symbol run folders). Lists of symbols typed by a user
(`--symbols`, a symbols file) are parsed here too, so every trainer spells and refuses them alike."""

from __future__ import annotations

import re
from pathlib import Path

from trainers.errors import UsageError

# The one grammar every symbol from every source must match before it is used anywhere (a symbol
# becomes a file name in the price cache): Yahoo spellings like AAPL, BRK-B, BTC-USD, ^GSPC,
# EURUSD=X, 0700.HK. No '/', no leading '.', nothing that can leave a folder.
SYMBOL_RE = re.compile(r"^\^?[A-Z0-9][A-Z0-9.=-]{0,14}$")
SYMBOL_HINT = "expected yfinance spelling like AAPL, BRK-B, BTC-USD or ^GSPC (letters, digits, . - =, at most 16)"


# Quote currencies of a pair typed with '/' (BTC/USD): Yahoo spells it BTC-USD. Only these, so that
# any other 'AB/CD' is still refused as a path, not guessed into a symbol.
QUOTES = ("USD", "USDT", "USDC", "EUR", "GBP", "JPY", "CAD", "AUD", "CHF", "BTC", "ETH")


def to_yfinance_symbol(symbol: str) -> str:
    """'BRK.B' / 'brk/b' / ' BRK-B ' -> 'BRK-B' (a share class after '.' or '/'); 'btc/usd' -> 'BTC-USD'
    (a pair with a quote currency of QUOTES); '0700.HK' stays."""
    text = str(symbol).strip().upper()
    text = re.sub(r"^([A-Z]+)[./]([A-Z])$", r"\1-\2", text)
    return re.sub(rf"^([A-Z0-9]+)/({'|'.join(QUOTES)})$", r"\1-\2", text)


def is_symbol(text: str) -> bool:
    return isinstance(text, str) and bool(SYMBOL_RE.match(text)) and ".." not in text


def check_symbols(symbols, where: str, given=None) -> None:
    """Raise a one-line UsageError naming the malformed symbols, if any (as the user typed them when
    `given`, the texts the symbols were spelled from, is passed)."""
    shown = list(given) if given is not None else list(symbols)
    bad = [g for s, g in zip(symbols, shown) if not is_symbol(s)]
    if bad:
        raise UsageError(f"{where}: malformed symbol(s) {', '.join(map(repr, bad[:10]))}"
                         f"{' and more' if len(bad) > 10 else ''}; {SYMBOL_HINT}")


def unique_symbols(symbols: list[str], where: str, given: list[str] | None = None) -> list[str]:
    """`symbols` if every one is well-formed, none repeats and there is at least one; else one line."""
    check_symbols(symbols, where, given)
    dups = sorted({s for s in symbols if symbols.count(s) > 1})
    if dups:
        raise UsageError(f"{where}: duplicate symbol(s) {', '.join(dups[:10])}; each symbol may appear once")
    if not symbols:
        raise UsageError(f"{where}: no symbols")
    return symbols


def _split(text: str) -> list[str]:
    return [s for s in re.split(r"[,\s]+", text or "") if s.strip()]


def parse_symbols(text: str, where: str = "--symbols") -> list[str]:
    """A typed list ('AAPL, brk.b BTC/USD') -> ['AAPL', 'BRK-B', 'BTC-USD']. An empty or blank text is
    refused: it must never quietly mean "every symbol"."""
    given = _split(text)
    if not given:
        raise UsageError(f"{where} {text!r} names no symbol; give a list like AAPL,BRK-B,BTC-USD (or leave "
                         f"{where} out)")
    return unique_symbols([to_yfinance_symbol(s) for s in given], where, given)


def read_symbols_file(path: str, where: str = "--tickers-file") -> list[str]:
    """One symbol per line or comma separated, '#' starts a comment; or a CSV with a `symbol` column."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{where} {path}: no such file")
    lines = p.read_text().splitlines()
    header = lines[0].split(",") if lines else []
    if header and header[0].strip().lower() == "symbol":
        given = [line.split(",")[0].strip() for line in lines[1:] if line.strip()]
        return unique_symbols([to_yfinance_symbol(g) for g in given], f"{where} {path}", given)
    given = _split(" ".join(line.split("#", 1)[0] for line in lines))
    if not given:
        raise UsageError(f"{where} {path} holds no symbol; one per line, like AAPL or BTC-USD")
    return unique_symbols([to_yfinance_symbol(g) for g in given], f"{where} {path}", given)
