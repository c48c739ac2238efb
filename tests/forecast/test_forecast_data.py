"""The forecaster on the data users have: a cache a fetch filled, close-only files, the point-in-time
S&P 500 universe (offline: a file, or an injected downloader), and the feature and label options."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import read_results, run_cli
from trainers.cli import main
from trainers.errors import UsageError
from trainers.forecast.config import ForecastConfig
from trainers.forecast.data import load_store, pin_dates
from trainers.forecast.export import export_run
from trainers.forecast.train import train
from trainers.market import sources
from trainers.market.fetch import PriceCache
from trainers.market.synthetic import synthetic_market


@pytest.mark.slow
def test_fetch_synthetic_into_cache_then_train_from_cache(tmp_path, capsys):
    cache = tmp_path / "cache"
    assert main(["fetch-sp500", "--source", "synthetic", "--synthetic-tickers", "12", "--synthetic-days", "800",
                 "--cache-dir", str(cache), "--no-progress"]) == 0
    meta = PriceCache(cache).metadata()
    assert meta["source"].startswith("synthetic") and len(meta["tickers"]) == 12
    run_dir = tmp_path / "run"
    # the synthetic prices are dated from 2000-01-03; a cache's default window is the 25 years back from today,
    # which from December 2026 cuts into them, so the test names its start (a date that does not move)
    run_cli(["forecast", "train", "--source", "cache", "--cache-dir", str(cache), "--window", "32", "--horizon", "5",
             "--epochs", "1", "--run-dir", str(run_dir), "--tickers", "SYN000,SYN001,SYN002,SYN003,SYN004,SYN005",
             "--start", "2000-01-01"],
            check=True)
    r = read_results(run_dir)
    assert r["data"]["source"] == "cache" and r["data"]["synthetic"] is True
    assert r["data"]["tickers_used"] == [f"SYN00{i}" for i in range(6)] and r["data"]["n_tickers"] == 6
    assert r["config"]["start"] and r["config"]["end"]  # pinned on the first run for resumes
    assert "validation" in r["data"]


def close_only_file(tmp_path, n_tickers=8, n_days=700, symbols=None, start="2000-01-03"):
    frame = synthetic_market(n_tickers, n_days, seed=4, start=start, momentum=0.3)
    if symbols is not None:
        frame["ticker"] = frame["ticker"].map(dict(zip(sorted(frame["ticker"].unique()), symbols)))
    path = tmp_path / "close_only.csv"
    frame[["date", "ticker", "close"]].rename(columns={"close": "Close"}).to_csv(path, index=False)
    return path


def test_a_close_only_file_trains_on_the_features_it_allows_and_exports(tmp_path):
    path = close_only_file(tmp_path)
    run_dir = tmp_path / "run"
    r = train(ForecastConfig(source=f"file:{path}", run_dir=str(run_dir), window=20, horizon=5, max_steps=3,
                             min_history_days=100))
    assert r["data"]["features"] == ["ret_1d", "vol_20d"] and r["preprocessing"]["features"] == ["ret_1d", "vol_20d"]
    assert set(r["data"]["features_left_out"]) == {"range_hl", "ret_oc", "volume_z"}
    assert "needs volume" in r["data"]["features_left_out"]["volume_z"]
    assert r["data"]["validation"]["columns_absent"] == ["open", "high", "low", "volume"]
    assert r["data"]["validation"]["rows_dropped"] == 0 and r["config"]["features"] == "ret_1d,vol_20d"
    assert "range_hl left out" in (run_dir / "training.log").read_text()
    info = export_run(run_dir, latency_iters=1)
    assert info["input"]["shape"] == ["batch", 20, 2] and info["output"]["name"] == "rank_score"
    with pytest.raises(UsageError, match="ret_oc needs open"):  # asking for a feature the data cannot give
        load_store(ForecastConfig(source=f"file:{path}", window=20, horizon=5, min_history_days=100,
                                  features="ret_1d,ret_oc"))


def test_features_option_picks_and_orders_the_inputs(tmp_path):
    store, info = load_store(ForecastConfig(synthetic_tickers=5, synthetic_days=500, window=20, horizon=5,
                                            features="vol_20d,ret_1d"), log=lambda _m: None)
    assert store.feature_names == ["vol_20d", "ret_1d"] and store.features.shape[-1] == 2
    with pytest.raises(UsageError, match="distinct names"):
        ForecastConfig(features="ret_1d,ret_1d").validate()
    with pytest.raises(UsageError, match="distinct names"):
        ForecastConfig(features="alpha").validate()


def test_targets_are_the_return_its_excess_and_its_rank(tmp_path):
    stores = {t: load_store(ForecastConfig(synthetic_tickers=6, synthetic_days=500, window=20, horizon=5, target=t),
                            log=lambda _m: None)[0] for t in ("raw", "demeaned", "rank")}
    ids = stores["raw"].sample_ids["train"]
    t, n = ids // 6, ids % 6
    raw = stores["raw"].target[t, n].double().numpy()
    np.testing.assert_allclose(raw, stores["raw"].forward_return[t.numpy(), n.numpy()], rtol=1e-5)
    demeaned = stores["demeaned"].target[t, n].double().numpy()
    day = t.numpy() == t[0].item()
    np.testing.assert_allclose(demeaned[day], raw[day] - raw[day].mean(), atol=1e-6)
    rank = stores["rank"].target[t, n].numpy()
    assert sorted(rank[day].tolist()) == pytest.approx([-1, -0.6, -0.2, 0.2, 0.6, 1])
    assert np.argsort(rank[day]).tolist() == np.argsort(raw[day]).tolist()


SP500_SAMPLE = ["AAPL", "AAL", "ABNB", "AAP", "MSFT", "ZZZZ"]  # AAL left 2024-09-23, ABNB joined 2023-09-18,
#                                                               AAP left 2023-08-25; ZZZZ was never a member


def test_sp500_pit_uses_each_company_only_while_it_was_in_the_index(tmp_path):
    path = close_only_file(tmp_path, n_tickers=6, n_days=900, symbols=sorted(SP500_SAMPLE), start="2022-01-03")
    store, info = load_store(ForecastConfig(source=f"file:{path}", universe="sp500-pit", window=20, horizon=5,
                                            min_history_days=100), log=lambda _m: None)
    assert store.tickers == ["AAL", "AAP", "AAPL", "ABNB", "MSFT"]  # ZZZZ, never a member, is not read
    ids = torch.cat([store.sample_ids[s] for s in ("train", "val", "test")])
    used: dict[str, list[str]] = {}
    for i in ids.tolist():
        used.setdefault(store.tickers[i % store.n_tickers], []).append(store.dates[i // store.n_tickers])
    assert min(used["ABNB"]) >= "2023-09-18" and max(used["AAL"]) < "2024-09-23" and max(used["AAP"]) < "2023-08-25"
    assert min(used["AAPL"]) < "2023-01-01" and max(used["AAPL"]) > "2025-01-01"  # a member all along
    universe = info["universe"]
    assert universe["name"] == "sp500-pit" and universe["members"] > 500
    assert 0 < universe["covered_share"] < 0.02 and "NVDA" in universe["missing"] and "AAPL" not in universe["missing"]
    assert sum(universe["missing"].values()) + sum(universe["partly_priced"].values()) == pytest.approx(
        1 - universe["covered_share"])
    assert universe["never_members"] == ["ZZZZ"]
    with pytest.raises(UsageError, match="needs real prices"):
        ForecastConfig(universe="sp500-pit").validate()


def test_sp500_pit_from_yahoo_reports_what_could_not_be_fetched(tmp_path, monkeypatch):
    """Offline: an injected downloader that has prices for five members and none for the rest."""
    have = {"AAPL", "MSFT", "AAL", "AAP", "ABNB"}  # AAP left 2023-08-25, ABNB joined 2023-09-18
    calls = []

    def fake_download(tickers, start, end):
        calls.append(list(tickers))
        idx = pd.bdate_range(start, end, inclusive="left", name="Date")
        parts = {}
        for i, t in enumerate(sorted(have & set(tickers))):
            close = 50 * np.exp(np.cumsum(np.random.default_rng(i).normal(0, 0.01, len(idx))))
            parts[t] = pd.DataFrame({"Open": close, "High": close * 1.01, "Low": close * 0.99, "Close": close,
                                     "Volume": 1e6}, index=idx)
        frame = pd.concat(parts, axis=1, names=["Ticker", "Price"]) if parts else pd.DataFrame()
        frame.attrs["errors"] = {t: "YFPricesMissingError('possibly delisted; no price data found')"
                                 for t in tickers if t not in have}
        return frame

    monkeypatch.setattr(sources, "yfinance_downloader", fake_download)
    cfg = ForecastConfig(source="yfinance", universe="sp500-pit", start="2021-01-04", end="2024-01-02", window=20,
                         horizon=5, cache_dir=str(tmp_path / "cache"), min_history_days=100)
    store, info = load_store(cfg, log=lambda _m: None)
    asked = {t for batch in calls for t in batch}
    assert {"AAL", "AAP", "AAPL"} <= asked and "ABNB" in asked  # every member of those years, the leavers too
    assert store.tickers == ["AAL", "AAP", "AAPL", "ABNB", "MSFT"] and info["fetch"]["empty"] == len(asked) - 5
    # three members all along, AAP for 2.6 of the 3 years, ABNB for 0.3: about 3.9 of ~500 members
    assert info["universe"]["covered_share"] == pytest.approx(3.9 / 500, rel=0.15)
    assert set(info["universe"]["missing"]) == asked - have


def test_bad_files_are_one_line_and_symbols_are_spelled_like_tickers(tmp_path):
    frame = synthetic_market(6, 300, seed=1)[["date", "ticker", "close"]]
    blank = frame.copy()
    blank.loc[blank.index[5], "ticker"] = None
    blank.to_csv(tmp_path / "blank.csv", index=False)
    with pytest.raises(UsageError, match=r"1 row\(s\) have no ticker \(first: row 6"):
        sources.read_user_file(str(tmp_path / "blank.csv"))
    frame.assign(Close=frame["close"]).to_csv(tmp_path / "twice.csv", index=False)
    with pytest.raises(UsageError, match="differ only in case.*'close', 'Close'"):
        sources.read_user_file(str(tmp_path / "twice.csv"))
    frame.assign(ticker=frame["ticker"].map({t: s for t, s in zip(sorted(frame["ticker"].unique()),
                                                                     ["BF.B", "brk/b", "AAPL", "A", "B", "C"])})
                 ).to_csv(tmp_path / "classes.csv", index=False)
    assert set(sources.read_user_file(str(tmp_path / "classes.csv"))["ticker"]) == {"BF-B", "BRK-B", "AAPL", "A", "B",
                                                                                    "C"}


def test_fewer_names_than_a_cross_section_needs_is_refused_and_the_universe_is_what_was_applied(tmp_path):
    with pytest.raises(UsageError, match="needs at least 5"):
        load_store(ForecastConfig(synthetic_tickers=4, synthetic_days=500, window=20, horizon=5), log=lambda _m: None)
    path = close_only_file(tmp_path, n_tickers=6)
    _, info = load_store(ForecastConfig(source=f"file:{path}", window=20, horizon=5, min_history_days=100),
                         log=lambda _m: None)
    assert info["universe"]["name"] == "every ticker of the source"  # not "sp500": a file is read whole
    cfg = ForecastConfig(features=" ret_1d , vol_20d ")
    cfg.validate()
    assert cfg.features == "ret_1d,vol_20d"  # what config.json pins: a resume with "ret_1d,vol_20d" matches


def test_coverage_counts_only_the_index_days_that_have_a_price():
    from trainers.market.pit import coverage

    history = pd.DataFrame({"symbol": ["A", "B", "C"], "added": pd.to_datetime(["2020-01-01"] * 3),
                            "removed": pd.to_datetime([None, None, "2020-01-08"])})
    dates = pd.bdate_range("2020-01-01", periods=10)
    priced = np.ones((10, 2), dtype=bool)
    priced[:6, 1] = False  # B priced on its last 4 member days only
    got = coverage(history, dates, ["A", "B"], priced)
    # index-days: A 10, B 10, C 5 (removed on the 6th business day) = 25; covered: A 10 + B 4
    assert got["index_days"] == 25 and got["covered_share"] == pytest.approx(14 / 25)
    assert got["missing"] == {"C": pytest.approx(5 / 25)} and got["partly_priced"] == {"B": pytest.approx(6 / 25)}


def test_years_on_a_file_count_back_from_its_last_date(tmp_path):
    path = close_only_file(tmp_path, n_tickers=6, n_days=800)  # business days from 2000-01-03 to 2003-01-24
    cfg = ForecastConfig(source=f"file:{path}", years=2.0, window=20, horizon=5, min_history_days=100)
    _, info = load_store(cfg, log=lambda _m: None)
    assert info["first_date"].startswith("2001-01") and info["last_date"].startswith("2003-01")
    pinned = pin_dates(cfg, None)  # what a first run pins in config.json
    assert pinned.end == "2003-01-25" and pinned.start.startswith("2001-01")  # not two years back from today
    with pytest.raises(UsageError, match=r"no rows in \[1990-01-01, 1991-01-01\).*the file holds 2000-01-03 \.\. 2003"):
        load_store(ForecastConfig(source=f"file:{path}", start="1990-01-01", end="1991-01-01", window=20, horizon=5),
                   log=lambda _m: None)


def test_a_price_file_edited_after_training_is_refused_by_evaluate_and_resume(tmp_path, capsys):
    """The forecaster recorded no fingerprint of its data: `forecast evaluate` scored a run on a file edited since
    as if it were the one it trained on, and a resume trained on. A run now records its bars (data.json); a
    run trained before it did (checkpoints, no data.json) is still evaluated, unchecked, as before."""
    path = close_only_file(tmp_path)
    run_dir = tmp_path / "run"
    args = ["forecast", "train", "--source", f"file:{path}", "--window", "20", "--horizon", "5", "--max-steps", "3",
            "--min-history-days", "100", "--run-dir", str(run_dir)]
    assert main(args) == 0
    assert json.loads((run_dir / "data.json").read_text())["fingerprint"]
    frame = pd.read_csv(path)
    edited = frame.copy()
    edited.loc[edited.index[-40:], "Close"] *= 2  # one ticker's last closes doubled
    edited.to_csv(path, index=False)
    capsys.readouterr()
    before = (run_dir / "results.json").read_bytes()
    for argv, advice in ((["forecast", "evaluate", "--run-dir", str(run_dir)], "its evaluation needs the data"),
                         (args, "resume with the data")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "was trained on other data" in err[0] and advice in err[0], err
    assert (run_dir / "results.json").read_bytes() == before
    frame.to_csv(path, index=False)  # the data it was trained on: evaluated again
    assert main(["forecast", "evaluate", "--run-dir", str(run_dir)]) == 0
    (run_dir / "data.json").unlink()  # a run from before the record: evaluated as it was, on whatever data
    edited.to_csv(path, index=False)
    assert main(["forecast", "evaluate", "--run-dir", str(run_dir)]) == 0
