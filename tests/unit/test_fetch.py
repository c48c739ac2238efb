"""Fetch logic against an injected downloader that returns yfinance-shaped frames."""

import datetime as dt
import json
import random

import numpy as np
import pandas as pd
import pytest

from trainers.errors import UsageError
from trainers.market.fetch import (
    FetchSettings,
    PriceCache,
    fetch_prices,
    split_download,
    yfinance_downloader,
)

START, END = "2020-01-01", "2021-06-30"
FIELDS = ["Open", "High", "Low", "Close", "Volume"]


def bars_for(ticker: str, start=START, end=END) -> pd.DataFrame:
    idx = pd.bdate_range(start, end, inclusive="left", name="Date")
    rng = np.random.default_rng(abs(hash(ticker)) % 2**32)
    close = 50 * np.exp(np.cumsum(rng.normal(0, 0.01, len(idx))))
    return pd.DataFrame({"Open": close * 0.999, "High": close * 1.01, "Low": close * 0.99, "Close": close,
                         "Volume": rng.integers(1_000, 10_000, len(idx)).astype(float)}, index=idx)


def yf_frame(tickers, errors=None, nan_for=()) -> pd.DataFrame:
    """Like yfinance.download(group_by='ticker'): columns (Ticker, Price); failed tickers are NaN columns."""
    parts = {}
    for t in tickers:
        b = bars_for(t)
        if t in nan_for:
            b[:] = np.nan
        parts[t] = b
    frame = pd.concat(parts, axis=1, names=["Ticker", "Price"])
    frame.attrs["errors"] = dict(errors or {})
    return frame


class FakeYahoo:
    """Scripted behaviour per ticker: ok (default), empty, error:<msg>, ratelimit:<n>, missing."""

    def __init__(self, script=None, raise_first=0, exc=ConnectionError("connection reset by peer")):
        self.script = dict(script or {})
        self.calls: list[list[str]] = []
        self.raise_first = raise_first
        self.exc = exc
        self.rate_left = {t: int(v.split(":")[1]) for t, v in self.script.items() if v.startswith("ratelimit")}

    def __call__(self, tickers, start, end):
        self.calls.append(list(tickers))
        if len(self.calls) <= self.raise_first:
            raise self.exc
        errors, nan_for, present = {}, [], []
        for t in tickers:
            how = self.script.get(t, "ok")
            if how == "missing":
                continue
            present.append(t)
            if how == "empty":
                nan_for.append(t)
            elif how.startswith("error:"):
                nan_for.append(t)
                errors[t] = how[6:]
            elif how.startswith("ratelimit") and self.rate_left[t] > 0:
                self.rate_left[t] -= 1
                nan_for.append(t)
                errors[t] = "YFRateLimitError('Too Many Requests. Rate limited. Try after a while.')"
        return yf_frame(present, errors, nan_for) if present else pd.DataFrame()


def settings(**kw):
    base = dict(start=START, end=END, batch_size=3, max_workers=2, retries=3, backoff_s=1.0, min_rows=100)
    base.update(kw)
    return FetchSettings(**base)


def fetch(tmp_path, tickers, fake, sleeps=None, **kw):
    sleeps = [] if sleeps is None else sleeps
    return fetch_prices(tickers, PriceCache(tmp_path / "cache"), settings(**kw), fake, sleep=sleeps.append,
                        rng=random.Random(0), progress=False, log=lambda m: None)


TICKERS = ["AAA", "BBB", "CCC", "DDD", "EEE", "FFF", "GGG"]


def test_batches_and_cache_layout(tmp_path):
    fake = FakeYahoo()
    report = fetch(tmp_path, TICKERS, fake)
    assert sorted(len(c) for c in fake.calls) == [1, 3, 3]
    assert sorted(sum(fake.calls, [])) == TICKERS
    assert report.fetched == 7 and report.failed == 0
    meta = json.loads((tmp_path / "cache" / "metadata.json").read_text())
    assert meta["source"] == "yfinance" and meta["adjusted"] is True
    for t in TICKERS:
        e = meta["tickers"][t]
        assert e["status"] == "ok" and e["rows"] == len(bars_for(t)) and e["first_date"] >= START
        cached = pd.read_parquet(tmp_path / "cache" / "prices" / f"{t}.parquet")
        assert list(cached.columns) == ["date", "open", "high", "low", "close", "volume"]
        np.testing.assert_allclose(cached["close"].to_numpy(), bars_for(t)["Close"].to_numpy())


def test_network_errors_are_retried_with_exponential_backoff_and_jitter(tmp_path):
    fake = FakeYahoo(raise_first=2)
    sleeps = []
    report = fetch(tmp_path, ["AAA", "BBB"], fake, sleeps=sleeps, max_workers=1)
    assert report.fetched == 2 and report.attempts == 3
    assert len(sleeps) == 2
    assert 1.0 <= sleeps[0] < 2.0 and 2.0 <= sleeps[1] < 4.0  # base * 2^k * (1 + jitter)


def test_rate_limited_tickers_are_retried_alone(tmp_path):
    fake = FakeYahoo({"BBB": "ratelimit:2"})
    sleeps = []
    report = fetch(tmp_path, ["AAA", "BBB", "CCC"], fake, sleeps=sleeps, max_workers=1)
    assert report.fetched == 3 and report.failed == 0
    assert fake.calls == [["AAA", "BBB", "CCC"], ["BBB"], ["BBB"]] and len(sleeps) == 2


def test_partial_failure_records_each_outcome_with_its_reason(tmp_path):
    fake = FakeYahoo({"BBB": "empty", "CCC": "error:YFTzMissingError('possibly delisted; no timezone found')",
                      "DDD": "missing", "EEE": "error:YFException('unexpected response from Yahoo')"})
    report = fetch(tmp_path, ["AAA", "BBB", "CCC", "DDD", "EEE"], fake)
    o = report.outcomes
    assert o["AAA"]["status"] == "ok"
    assert o["BBB"]["status"] == "empty" and o["DDD"]["status"] == "empty"
    assert o["CCC"]["status"] == "empty" and "delisted" in o["CCC"]["reason"]  # Yahoo's answer: no rows
    assert o["EEE"]["status"] == "failed" and "unexpected response" in o["EEE"]["reason"]
    assert (report.fetched, report.empty, report.failed) == (1, 3, 1)
    meta = json.loads((tmp_path / "cache" / "metadata.json").read_text())
    assert meta["tickers"]["CCC"]["reason"] == o["CCC"]["reason"] and meta["tickers"]["AAA"]["source"] == "yfinance"


def test_a_batch_that_keeps_failing_marks_its_tickers_failed_and_the_rest_goes_on(tmp_path):
    class Flaky(FakeYahoo):
        def __call__(self, tickers, start, end):
            if "AAA" in tickers:
                self.calls.append(list(tickers))
                raise TimeoutError("read timed out")
            return super().__call__(tickers, start, end)

    fake = Flaky()
    report = fetch(tmp_path, TICKERS, fake, retries=2)
    failed = {t for t, o in report.outcomes.items() if o["status"] == "failed"}
    assert failed == {"AAA", "BBB", "CCC"}
    assert all("TimeoutError: read timed out" in report.outcomes[t]["reason"] for t in failed)
    assert report.fetched == 4


def test_every_ticker_failing_is_a_clear_error_naming_the_offline_sources(tmp_path):
    fake = FakeYahoo(raise_first=10**6, exc=OSError("Name or service not known"))
    with pytest.raises(UsageError) as info:
        fetch(tmp_path, ["AAA", "BBB"], fake, retries=1)
    msg = str(info.value)
    assert "--source synthetic" in msg and "--source file:PATH" in msg and "Name or service not known" in msg
    assert not list((tmp_path / "cache").glob("prices/*.parquet"))


def test_interrupted_fetch_keeps_what_it_wrote_and_the_rerun_fetches_only_the_rest(tmp_path):
    class Killed(FakeYahoo):
        def __call__(self, tickers, start, end):
            if len(self.calls) == 1:
                raise KeyboardInterrupt  # Ctrl-C / kill in the middle of the second batch
            return super().__call__(tickers, start, end)

    with pytest.raises(KeyboardInterrupt):
        fetch(tmp_path, TICKERS, Killed(), max_workers=1)
    meta = json.loads((tmp_path / "cache" / "metadata.json").read_text())
    assert sorted(meta["tickers"]) == TICKERS[:3]
    assert not list((tmp_path / "cache").rglob("*.tmp"))
    fake = FakeYahoo()
    report = fetch(tmp_path, TICKERS, fake, max_workers=1)
    assert sorted(sum(fake.calls, [])) == TICKERS[3:]
    assert report.cached == 3 and report.fetched == 4


def test_cache_reuse_refresh_and_staleness(tmp_path):
    fetch(tmp_path, ["AAA", "BBB"], FakeYahoo())
    fake = FakeYahoo()
    report = fetch(tmp_path, ["AAA", "BBB"], fake)
    assert fake.calls == [] and report.cached == 2 and report.rows > 0
    fake = FakeYahoo()
    fetch(tmp_path, ["AAA", "BBB"], fake, refresh=True)
    assert sorted(sum(fake.calls, [])) == ["AAA", "BBB"]
    # a later end date: fresh while young, fetched again once older than max_age_hours
    later = dict(end="2021-07-30")
    fake = FakeYahoo()
    fetch(tmp_path, ["AAA"], fake, **later)
    assert fake.calls == []
    fake = FakeYahoo()
    fetch_prices(["AAA"], PriceCache(tmp_path / "cache"), settings(**later), fake, sleep=lambda s: None,
                 now=lambda: dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2), progress=False,
                 log=lambda m: None)
    assert fake.calls == [["AAA"]]
    # an earlier start than cached is never covered by the cache
    fake = FakeYahoo()
    fetch(tmp_path, ["BBB"], fake, start="2019-01-01")
    assert fake.calls == [["BBB"]]


def test_too_short_history_is_excluded_not_cached(tmp_path):
    class ShortAAA(FakeYahoo):
        def __call__(self, tickers, start, end):
            frame = super().__call__(tickers, start, end)
            frame.loc[frame.index[50]:, ("AAA", slice(None))] = np.nan  # AAA has only 50 bars
            return frame

    report = fetch(tmp_path, ["AAA", "BBB"], ShortAAA())
    assert report.outcomes["AAA"]["status"] == "excluded" and "only 50 valid bars" in report.outcomes["AAA"]["reason"]
    assert report.excluded == 1 and report.fetched == 1
    assert not (tmp_path / "cache" / "prices" / "AAA.parquet").exists()
    with pytest.raises(UsageError, match="no ticker could be fetched"):
        fetch(tmp_path / "other", ["AAA"], FakeYahoo(), min_rows=10_000)


def test_split_download_accepts_yfinance_layouts():
    by_ticker = yf_frame(["AAA", "BBB"])
    by_column = by_ticker.swaplevel(axis=1).sort_index(axis=1)
    for frame in (by_ticker, by_column):
        parts = split_download(frame, ["AAA", "BBB", "ZZZ"])
        assert parts["ZZZ"] is None and len(parts["AAA"]) == len(bars_for("AAA"))
        assert list(parts["BBB"].columns) == ["date", "open", "high", "low", "close", "volume"]
    flat = bars_for("AAA")
    flat.index = flat.index.tz_localize("America/New_York")
    one = split_download(flat, ["AAA"])["AAA"]
    assert one["date"].dt.tz is None and one["date"].iloc[0] == pd.Timestamp(START).normalize() + pd.offsets.BDay(0)
    assert split_download(pd.DataFrame(), ["AAA"]) == {"AAA": None}


def test_real_client_asks_for_adjusted_daily_bars(monkeypatch):
    import yfinance

    seen = {}

    def fake_download(tickers, **kw):
        seen.update(kw, tickers=tickers)
        return yf_frame(["AAA"])

    monkeypatch.setattr(yfinance, "download", fake_download)
    frame = yfinance_downloader(["AAA"], START, END)
    assert seen["auto_adjust"] is True and seen["interval"] == "1d" and seen["group_by"] == "ticker"
    assert seen["start"] == START and seen["end"] == END and seen["progress"] is False
    assert frame.attrs["errors"] == {}


def yahoo_history(behaviour: dict):
    """Stand-in for yfinance.Ticker.history, the per-ticker call inside the real `yf.download()` (1.x):
    'ok' -> bars, 'empty' -> no rows with yfinance's soft 'delisted' error, an exception -> raised."""
    import types

    def history(self, **kw):
        how = behaviour.get(self.ticker, "ok")
        if isinstance(how, BaseException):
            raise how
        if how == "empty":
            self._price_history = types.SimpleNamespace(_last_error=f"${self.ticker}: possibly delisted; no price "
                                                                    f"data found (1d {START} -> {END})")
            return pd.DataFrame(columns=FIELDS, index=pd.DatetimeIndex([], name="Date"))
        self._price_history = types.SimpleNamespace(_last_error=None)
        return bars_for(self.ticker).tz_localize("America/New_York")
    return history


def test_yfinance_1x_errors_are_read_from_its_log_and_classified(monkeypatch):
    """yfinance 1.x no longer fills shared._ERRORS: its download() logs `['BAD']: <repr>`. Run the real
    download() with the network faked one level down and check what the client reports."""
    import curl_cffi.requests.exceptions as curl
    import yfinance
    from yfinance.exceptions import YFRateLimitError

    from trainers.market.fetch import is_transient

    monkeypatch.setattr(yfinance.Ticker, "history", yahoo_history({
        "NET": curl.ConnectionError("Failed to perform, curl: (6) Could not resolve host: query2.finance.yahoo.com"),
        "RATE": YFRateLimitError(), "GONE": "empty"}))
    frame = yfinance_downloader(["AAA", "NET", "RATE", "GONE"], START, END)
    errors = frame.attrs["errors"]
    assert set(errors) == {"NET", "RATE", "GONE"}
    assert "Could not resolve host" in errors["NET"] and "Rate limited" in errors["RATE"]
    assert is_transient(errors["NET"]) and is_transient(errors["RATE"]) and not is_transient(errors["GONE"])
    parts = split_download(frame, ["AAA", "NET", "RATE", "GONE"])
    assert parts["AAA"] is not None and len(parts["AAA"]) > 300 and parts["GONE"] is None


def test_network_errors_through_the_real_client_are_retried_with_backoff_then_failed_with_their_cause(tmp_path,
                                                                                                   monkeypatch):
    import curl_cffi.requests.exceptions as curl
    import yfinance

    monkeypatch.setattr(yfinance.Ticker, "history", yahoo_history({
        "NET": curl.ConnectionError("Failed to perform, curl: (7) Failed to connect: Connection refused"),
        "GONE": "empty"}))
    sleeps: list[float] = []
    report = fetch(tmp_path, ["AAA", "NET", "GONE"], yfinance_downloader, sleeps=sleeps, retries=2)
    assert report.outcomes["AAA"]["status"] == "ok" and report.outcomes["GONE"]["status"] == "empty"
    assert report.outcomes["NET"]["status"] == "failed" and "Connection refused" in report.outcomes["NET"]["reason"]
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] / 2  # two retries of NET alone, backing off


def test_fetch_command_flags_reach_the_fetcher(tmp_path):
    import argparse

    from trainers.market.cli import add_fetch_args
    from trainers.market.commands import run_fetch

    parser = argparse.ArgumentParser()
    add_fetch_args(parser)
    args = parser.parse_args(["--tickers", "AAA,BBB,CCC,DDD,EEE", "--batch-size", "2", "--max-workers", "1",
                              "--start", START, "--end", END, "--cache-dir", str(tmp_path / "c"), "--no-progress",
                              "--min-history-days", "100"])
    fake = FakeYahoo()
    out = run_fetch(args, downloader=fake)
    assert fake.calls == [["AAA", "BBB"], ["CCC", "DDD"], ["EEE"]]
    assert out["fetched"] == 5 and out["cache_dir"] == str(tmp_path / "c")
    fake = FakeYahoo()
    out = run_fetch(parser.parse_args([*args_list(args), "--refresh"]), downloader=fake)
    assert len(sum(fake.calls, [])) == 5 and out["cached"] == 0


def args_list(ns) -> list[str]:
    return ["--tickers", ns.tickers, "--batch-size", "2", "--max-workers", "1", "--start", ns.start, "--end", ns.end,
            "--cache-dir", ns.cache_dir, "--no-progress", "--min-history-days", "100"]
