import pandas as pd
import pytest

from trainers.errors import UsageError
from trainers.market.symbols import to_yfinance_symbol
from trainers.market.universe import (
    load_universe,
    parse_tickers,
    read_tickers_file,
    resolve_tickers,
    validate_universe,
)


def test_shipped_sp500_is_clean_and_in_yfinance_spelling():
    u = load_universe("sp500")
    assert 490 <= len(u) <= 510 and u["symbol"].is_unique
    assert {"AAPL", "MSFT", "BRK-B", "BF-B"} <= set(u["symbol"])
    assert not u["symbol"].str.contains(r"\.").any()
    assert u["snapshot_date"].nunique() == 1 and u["snapshot_date"].iloc[0] >= "2026-01-01"


def test_symbol_spelling_is_normalised():
    assert to_yfinance_symbol(" brk.b ") == "BRK-B" and to_yfinance_symbol("BF/B") == "BF-B"
    assert parse_tickers("aapl, msft  BRK.B") == ["AAPL", "MSFT", "BRK-B"]


@pytest.mark.parametrize("text,match", [("AAPL,AAPL", "duplicate symbol"), ("AAPL,$$X", "malformed symbol"),
                                        ("WAYTOOLONGSYMBOLNAME", "malformed"), ("../../X", "malformed"), ("/TMP/X", "malformed"), (" , ", "names no symbol")])
def test_bad_ticker_lists_are_rejected(text, match):
    with pytest.raises(UsageError, match=match):
        parse_tickers(text)


def test_universe_file_with_duplicates_is_rejected(tmp_path):
    frame = pd.DataFrame({"symbol": ["AAPL", "AAPL"], "name": ["a", "b"], "gics_sector": "", "added": "",
                          "snapshot_date": "2026-10-06"})
    with pytest.raises(UsageError, match="duplicate symbol.*AAPL"):
        validate_universe(frame, "x.csv")


def test_tickers_file_and_precedence(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("# my list\nAAPL\nmsft  # comment\n\nbrk.b\n")
    assert read_tickers_file(str(f)) == ["AAPL", "MSFT", "BRK-B"]
    csv = tmp_path / "t.csv"
    csv.write_text("symbol,name\nNVDA,Nvidia\nAMD,AMD\n")
    assert read_tickers_file(str(csv)) == ["NVDA", "AMD"]
    assert resolve_tickers("XOM", None, "sp500") == ["XOM"]
    assert resolve_tickers(None, str(f), "sp500") == ["AAPL", "MSFT", "BRK-B"]
    assert len(resolve_tickers(None, None, "sp500")) > 400
    with pytest.raises(UsageError, match="not both"):
        resolve_tickers("XOM", str(f), "sp500")
    with pytest.raises(UsageError, match="no such file"):
        read_tickers_file(str(tmp_path / "nope.txt"))
    with pytest.raises(UsageError, match="--universe 'nasdaq'"):
        load_universe("nasdaq")
