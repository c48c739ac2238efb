"""Market data that cannot be mixed up: one symbol grammar before any path, provenance per ticker,
one source per cache unless asked, a file's whole history."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from trainers.cli import main
from trainers.errors import UsageError
from trainers.market.fetch import FetchSettings, PriceCache, fetch_prices, fill_cache
from trainers.market.sources import DataRequest, load_source
from trainers.market.synthetic import synthetic_market


def tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("bad", ["../../x", "/tmp/x", "..", "AB/CD", "a b"])  # A/B is a share class: A-B
def test_a_file_with_a_path_for_a_ticker_writes_nothing_anywhere(tmp_path, bad, capsys):
    frame = synthetic_market(2, 300, seed=1)
    frame["ticker"] = frame["ticker"].astype(str).replace({"SYN001": bad})
    path = tmp_path / "in.csv"
    frame.to_csv(path, index=False)
    before = tree(tmp_path)
    assert main(["fetch-sp500", "--source", f"file:{path}", "--cache-dir", str(tmp_path / "cache"),
                 "--min-history-days", "10", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "malformed symbol" in err[0]
    assert tree(tmp_path) == before
    with pytest.raises(UsageError, match="is not a symbol"):
        PriceCache(tmp_path / "cache").path("../x")


def test_filling_a_cache_from_another_source_is_refused_unless_mixing_is_asked(tmp_path):
    cache = PriceCache(tmp_path / "cache")
    fill_cache(synthetic_market(3, 400, seed=1), cache, "synthetic(seed=1)", 100)
    other = synthetic_market(2, 400, seed=2)
    other["ticker"] = other["ticker"].astype(str).map({"SYN000": "AAA", "SYN001": "BBB"})
    with pytest.raises(UsageError, match=r"holds prices from synthetic\(seed=1\); filling it from file:x"):
        fill_cache(other, cache, "file:x", 100)
    assert set(cache.metadata()["tickers"]) == {"SYN000", "SYN001", "SYN002"}  # nothing replaced
    fill_cache(other, cache, "file:x", 100, mix_sources=True)
    meta = cache.metadata()
    assert {t: e["source"] for t, e in meta["tickers"].items()} == {
        "SYN000": "synthetic(seed=1)", "SYN001": "synthetic(seed=1)", "SYN002": "synthetic(seed=1)",
        "AAA": "file:x", "BBB": "file:x"}  # earlier entries kept, each with its own label
    frame, info = load_source(DataRequest(source="cache", cache_dir=str(cache.root), min_rows=100))
    assert info["sources"] == {"synthetic(seed=1)": 3, "file:x": 2} and info["synthetic"] is True


def test_a_yfinance_fetch_into_a_synthetic_cache_is_refused(tmp_path):
    cache = PriceCache(tmp_path / "cache")
    fill_cache(synthetic_market(2, 400, seed=1), cache, "synthetic(seed=1)", 100)
    with pytest.raises(UsageError, match="would mix sources"):
        fetch_prices(["AAPL"], cache, FetchSettings(start="2020-01-01", end="2021-01-01"),
                     lambda *a: pd.DataFrame(), rng=random.Random(0), progress=False, log=lambda m: None)


def test_bars_written_by_a_fill_killed_before_its_index_update_are_never_read_under_another_label(tmp_path):
    cache = PriceCache(tmp_path / "cache")
    fill_cache(synthetic_market(3, 400, seed=1), cache, "synthetic(seed=1)", 100)
    # what a kill between a file write and the index write leaves: new bars, the old entry
    real = synthetic_market(1, 400, seed=9)
    cache.write_bars("SYN001", real.drop(columns="ticker"), "file:/data/real.csv")
    warnings = []
    frame = cache.read(warn=warnings.append)
    assert sorted(frame["ticker"].unique()) == ["SYN000", "SYN002"]
    assert frame.attrs["sources"] == {"synthetic(seed=1)": 2}
    assert warnings and "SYN001" in warnings[0] and "file:/data/real.csv" in warnings[0]


def test_an_unreadable_cache_index_is_one_line(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "metadata.json").write_text("{oops")
    with pytest.raises(UsageError, match="is unreadable"):
        PriceCache(tmp_path / "cache").metadata()
    (tmp_path / "cache" / "metadata.json").write_text(json.dumps([1, 2]))
    with pytest.raises(UsageError, match="not a price-cache index"):
        PriceCache(tmp_path / "cache").metadata()


def test_a_file_source_keeps_its_whole_history_unless_asked(tmp_path):
    frame = synthetic_market(2, 9000, seed=3, start="1985-01-02")  # about 35 years
    path = tmp_path / "long.csv"
    frame.to_csv(path, index=False)
    whole, _ = load_source(DataRequest(source=f"file:{path}", min_rows=100))
    assert whole["date"].min() == pd.Timestamp("1985-01-02")
    cut, _ = load_source(DataRequest(source=f"file:{path}", years=10, end="2020-01-01", min_rows=100))
    assert cut["date"].min() >= pd.Timestamp("2009-12-01")


def test_tickers_that_differ_only_by_case_are_refused_not_merged(tmp_path):
    """PPO once merged 'aaa' and 'AAA' into one series and dropped one of them as duplicate dates."""
    import pandas as pd

    from trainers.errors import UsageError
    from trainers.market.sources import read_user_file

    dates = pd.bdate_range("2020-01-01", periods=5)
    rows = [{"date": d, "ticker": t, "close": 10.0 + i} for t in ("aaa", "AAA", "BBB") for i, d in enumerate(dates)]
    path = tmp_path / "prices.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    with pytest.raises(UsageError, match="tickers 'AAA' and 'aaa' are both AAA"):
        read_user_file(str(path))


@pytest.mark.parametrize("trainer", ["forecast", "ppo"])
def test_an_empty_ticker_list_is_refused_not_read_as_every_ticker(tmp_path, trainer, capsys):
    from trainers.cli import main

    run_dir = tmp_path / "run"
    assert main([trainer, "train", "--run-dir", str(run_dir), "--source", "cache", "--cache-dir", str(tmp_path),
                 "--tickers", ""]) == 2
    assert "--tickers '' names no symbol" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not run_dir.exists()
