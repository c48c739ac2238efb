"""The forecaster on data from the cache a fetch filled."""

import pytest

from conftest import read_results, run_cli
from trainers.cli import main
from trainers.market.fetch import PriceCache


@pytest.mark.slow
def test_fetch_synthetic_into_cache_then_train_from_cache(tmp_path, capsys):
    cache = tmp_path / "cache"
    assert main(["fetch-sp500", "--source", "synthetic", "--synthetic-tickers", "12", "--synthetic-days", "800",
                 "--cache-dir", str(cache), "--no-progress"]) == 0
    meta = PriceCache(cache).metadata()
    assert meta["source"].startswith("synthetic") and len(meta["tickers"]) == 12
    run_dir = tmp_path / "run"
    run_cli(["forecast", "train", "--source", "cache", "--cache-dir", str(cache), "--window", "32", "--horizon", "5",
             "--epochs", "1", "--run-dir", str(run_dir), "--tickers", "SYN000,SYN001,SYN002,SYN003,SYN004,SYN005"],
            check=True)
    r = read_results(run_dir)
    assert r["data"]["source"] == "cache" and r["data"]["synthetic"] is True
    assert r["data"]["tickers_used"] == [f"SYN00{i}" for i in range(6)] and r["data"]["n_tickers"] == 6
    assert r["config"]["start"] and r["config"]["end"]  # pinned on the first run for resumes
    assert "validation" in r["data"]
