"""The one symbol grammar, in one place and without pandas (configs import it): every symbol from
every source is checked against it before it is used anywhere, since a symbol becomes a file or
folder name (price cache files, per-symbol run folders)."""

from __future__ import annotations

import re

from trainers.errors import UsageError

# The one grammar every symbol from every source must match before it is used anywhere (a symbol
# becomes a file name in the price cache): Yahoo spellings like AAPL, BRK-B, BTC-USD, ^GSPC,
# EURUSD=X, 0700.HK. No '/', no leading '.', nothing that can leave a folder.
SYMBOL_RE = re.compile(r"^\^?[A-Z0-9][A-Z0-9.=-]{0,14}$")
SYMBOL_HINT = "expected yfinance spelling like AAPL, BRK-B, BTC-USD or ^GSPC (letters, digits, . - =, at most 16)"


def to_yfinance_symbol(symbol: str) -> str:
    """'BRK.B' / 'brk/b' / ' BRK-B ' -> 'BRK-B' (a share class after '.' or '/'); '0700.HK' stays."""
    text = str(symbol).strip().upper()
    return re.sub(r"^([A-Z]+)[./]([A-Z])$", r"\1-\2", text)


def is_symbol(text: str) -> bool:
    return isinstance(text, str) and bool(SYMBOL_RE.match(text)) and ".." not in text


def check_symbols(symbols, where: str) -> None:
    """Raise a one-line UsageError naming the malformed symbols, if any."""
    bad = [s for s in symbols if not is_symbol(s)]
    if bad:
        raise UsageError(f"{where}: malformed symbol(s) {', '.join(map(repr, bad[:10]))}"
                         f"{' and more' if len(bad) > 10 else ''}; {SYMBOL_HINT}")
