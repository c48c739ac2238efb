import numpy as np
import pandas as pd

from trainers.market.validate import (
    JUMP_FACTOR,
    ZERO_VOLUME_RUN,
    validate_bars,
    validate_long_table,
)


def clean_bars(n=300, seed=0):
    rng = np.random.default_rng(seed)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    return pd.DataFrame({"date": pd.bdate_range("2020-01-01", periods=n), "open": close, "high": close * 1.01,
                         "low": close * 0.99, "close": close, "volume": np.full(n, 1e5)})


def test_clean_bars_pass_untouched():
    bars = clean_bars()
    out, rep = validate_bars(bars, min_rows=100)
    assert len(out) == 300 and rep["rows_out"] == 300 and not rep["excluded"]
    assert all(rep[k] == 0 for k in ("duplicate_dates", "bad_prices", "inconsistent_ohlc", "zero_volume_run_rows",
                                      "spike_rows", "large_jumps_kept"))


def test_each_kind_of_bad_row_is_counted_and_dropped():
    b = clean_bars()
    dup = b.iloc[[10]].copy()
    dup["close"] *= 1.001
    b.loc[20, "close"] = np.nan
    b.loc[21, "open"] = -1.0
    b.loc[22, "low"] = 0.0
    b.loc[30, "high"] = b.loc[30, "close"] * 0.5  # high below close
    b.loc[100:100 + ZERO_VOLUME_RUN - 1, "volume"] = 0.0  # a halted feed
    b.loc[150, "volume"] = 0.0  # one quiet day is fine
    b.loc[200, ["open", "high", "low", "close"]] *= JUMP_FACTOR * 3  # a bad print that reverts next day
    b.loc[250:, ["open", "high", "low", "close"]] *= JUMP_FACTOR * 2  # a real-looking jump that stays
    out, rep = validate_bars(pd.concat([b, dup]), min_rows=100)
    assert rep["duplicate_dates"] == 1 and rep["bad_prices"] == 3 and rep["inconsistent_ohlc"] == 1
    assert rep["zero_volume_run_rows"] == ZERO_VOLUME_RUN and rep["spike_rows"] == 1 and rep["large_jumps_kept"] == 1
    assert rep["rows_out"] == rep["rows_in"] - 1 - 3 - 1 - ZERO_VOLUME_RUN - 1 == len(out)
    assert out["date"].is_unique and (out[["open", "high", "low", "close"]] > 0).all().all()
    assert out.loc[out["date"] == b.loc[10, "date"], "close"].item() == dup["close"].item()  # later row kept


def test_short_history_is_excluded_in_the_long_table_report():
    a = clean_bars(300).assign(ticker="AAA")
    b = clean_bars(50, seed=1).assign(ticker="BBB")
    table, rep = validate_long_table(pd.concat([a, b]), min_rows=100)
    assert set(table["ticker"]) == {"AAA"} and list(rep["excluded"]) == ["BBB"]
    assert "only 50 valid bars" in rep["excluded"]["BBB"] and rep["tickers_in"] == 2
