"""The signal and portfolio metrics against values worked out by hand."""

import math

import numpy as np
import pytest

from trainers.errors import UsageError
from trainers.forecast.data import cross_sectional
from trainers.forecast.evaluate import split_report
from trainers.forecast.metrics import (
    backtest,
    decile_returns,
    ic_summary,
    newey_west_t,
    per_date_ic,
    rebalance_dates,
    verdict,
)


def test_ic_and_rank_ic_per_date_by_hand():
    # date 0: Pearson of (1..5) with (2, 1, 4, 3, 50) = 98 / sqrt(10 * 1810); its ranks match 1..5 as
    # (2, 1, 4, 3, 5) does, so Spearman = 8 / 10. date 1: reversed, -1 both. date 2: 3 names, no IC.
    d = np.array([0] * 5 + [1] * 5 + [2] * 3)
    s = np.array([1, 2, 3, 4, 5, 5, 4, 3, 2, 1, 1, 2, 3], dtype=float)
    y = np.array([2, 1, 4, 3, 50, 1, 2, 3, 4, 5, 3, 2, 1], dtype=float)
    ic = per_date_ic(d, s, y)
    assert list(ic.index) == [0, 1]
    assert ic[0] == pytest.approx(98 / math.sqrt(10 * 1810)) and ic[1] == pytest.approx(-1.0)
    ric = per_date_ic(d, s, y, rank=True)
    assert ric[0] == pytest.approx(0.8) and ric[1] == pytest.approx(-1.0)
    flat = per_date_ic(np.zeros(5), np.ones(5), np.arange(5.0))  # a constant forecast has no IC
    assert flat.empty


def test_ic_summary_and_newey_west_by_hand():
    s = ic_summary(np.array([0.8, -1.0]), horizon=1)
    std = math.sqrt(2 * 0.9 ** 2)
    assert s["mean"] == pytest.approx(-0.1) and s["std"] == pytest.approx(std)
    assert s["icir"] == pytest.approx(-0.1 / std) and s["t"] == pytest.approx(-0.1 / std * math.sqrt(2))
    assert s["positive_share"] == 0.5 and s["dates"] == 2 and s["nw_lags"] == 0
    # x = 1, 2, 3, 6: e = -2, -1, 0, 3; gamma0 = 14/4, gamma1 = (2 + 0 + 0)/4;
    # var = 3.5 + 2 * (1 - 1/2) * 0.5 = 4; se = sqrt(4 / 4) = 1; t = mean 3 / 1
    assert newey_west_t(np.array([1.0, 2, 3, 6]), lags=1) == pytest.approx(3.0)
    assert newey_west_t(np.array([1.0, 2, 3, 6]), lags=0) == pytest.approx(3 / math.sqrt(3.5 / 4))
    # overlapping targets make neighbours alike: the Newey-West t is the smaller one
    rng = np.random.default_rng(0)
    smooth = np.convolve(rng.normal(0.05, 1, 400), np.ones(20) / 20, mode="valid")
    got = ic_summary(smooth, horizon=20)
    assert abs(got["t_nw"]) < abs(got["t"]) / 2


def test_portfolios_by_hand():
    """4 names, horizon 2, top/bottom 1, 10 bp: rebalances on dates 0, 2, 4 (1 and 3 are inside holds)."""
    d = np.repeat([0, 1, 2, 3, 4], 4)
    n = np.tile([0, 1, 2, 3], 5)
    score = np.array([4, 3, 2, 1, 9, 9, 9, 9, 1, 2, 3, 4, 9, 9, 9, 9, 4, 3, 2, 1], dtype=float)
    simple = np.array([.10, 0, 0, -.05, 9, 9, 9, 9, -.10, 0, 0, .20, 9, 9, 9, 9, -.20, 0, 0, 0])
    fwd = np.log1p(simple)
    assert rebalance_dates(d, 2) == [0, 2, 4]
    got = backtest(d, n, score, fwd, horizon=2, top_k=1, cost_bps=10)
    # long-short: +.10 - (-.05) less 2 units traded; +.20 - (-.10) less 4 (both legs flip); -.20 - 0 less 4
    ls_net = np.array([0.15 - 0.002, 0.30 - 0.004, -0.20 - 0.004])
    ls = got["long_short"]
    equity = np.cumprod(1 + ls_net)
    assert ls["periods"] == 3 and ls["turnover"] == pytest.approx(10 / 3)
    assert ls["total_return"] == pytest.approx(equity[-1] - 1)
    assert ls["ann_return"] == pytest.approx(equity[-1] ** (126 / 3) - 1)
    assert ls["ann_return_gross"] == pytest.approx(np.prod([1.15, 1.30, 0.80]) ** (126 / 3) - 1)
    assert ls["ann_vol"] == pytest.approx(ls_net.std(ddof=1) * math.sqrt(126))
    assert ls["sharpe"] == pytest.approx(ls_net.mean() * 126 / (ls_net.std(ddof=1) * math.sqrt(126)))
    assert ls["max_drawdown"] == pytest.approx(-0.204)
    assert ls["curve"]["dates"] == [0, 2, 4, 6] and ls["curve"]["equity"] == pytest.approx([1.0, *equity])
    lo = got["long_only"]  # .10 less 1 unit; .20 less 2 (sell 0, buy 3); -.20 less 2
    assert lo["total_return"] == pytest.approx(np.prod([1.099, 1.198, 0.798]) - 1)
    ew = backtest(d, n, None, fwd, horizon=2, top_k=1, cost_bps=10)["equal_weight"]
    assert ew["turnover"] == pytest.approx(1 / 3)  # only the first purchase trades
    assert ew["total_return"] == pytest.approx(np.prod([1.0125 - 0.001, 1.025, 0.95]) - 1)
    free = backtest(d, n, score, fwd, horizon=2, top_k=1, cost_bps=0)["long_short"]
    assert free["total_return"] == pytest.approx(np.prod([1.15, 1.30, 0.80]) - 1)


def test_default_top_k_is_a_fifth_and_never_more_than_half():
    d = np.zeros(10, dtype=int)
    n = np.arange(10)
    score = np.arange(10.0)
    fwd = np.log1p(np.arange(10) / 100)
    ls = backtest(d, n, score, fwd, 5, None, 0)["long_short"]
    assert ls["total_return"] == pytest.approx((0.09 + 0.08) / 2 - (0.0 + 0.01) / 2)  # k = 10 / 5 = 2
    ls = backtest(d, n, score, fwd, 5, 8, 0)["long_short"]
    assert ls["total_return"] == pytest.approx(np.mean([.05, .06, .07, .08, .09]) - np.mean([0, .01, .02, .03, .04]))


def test_decile_returns_and_verdict():
    d = np.repeat([0, 1], 10)
    score = np.concatenate([np.arange(10.0), np.arange(10.0)[::-1]])
    simple = np.concatenate([np.arange(10) / 100, np.arange(10)[::-1] / 100 + 0.02])
    got = decile_returns(d, score, np.log1p(simple))
    assert got == pytest.approx([(i / 100 + i / 100 + 0.02) / 2 for i in range(10)])
    assert verdict({"mean": 0.05, "t_nw": 2.5}, {"ann_return": 0.01})[0] == "skill"
    assert verdict({"mean": 0.05, "t_nw": 1.9}, {"ann_return": 0.30})[0] == "no skill detected"
    assert verdict({"mean": 0.05, "t_nw": 9.0}, {"ann_return": -0.01})[0] == "no skill detected"
    word, why = verdict({"mean": None, "t_nw": None}, {"ann_return": None})
    assert word == "no skill detected" and "n/a" in why


def test_labels_by_hand():
    values = np.array([[1.0, 3.0, 2.0, 7.0], [1.0, 1.0, 2.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    valid = np.array([[True, True, True, False], [True, True, True, False], [True, False, False, False]])
    np.testing.assert_allclose(cross_sectional(values, valid, "demeaned")[:2, :3], [[-1, 1, 0], [-1 / 3, -1 / 3, 2 / 3]])
    rank = cross_sectional(values, valid, "rank")
    np.testing.assert_allclose(rank[:2, :3], [[-1, 1, 0], [-0.5, -0.5, 1]])  # ties share their mean rank
    assert rank[2, 0] == 0 and np.isnan(rank[0, 3]) and np.isnan(cross_sectional(values, valid, "raw")[2, 1])


def test_a_perfect_forecast_and_its_mirror():
    rng = np.random.default_rng(0)
    d = np.repeat(np.arange(30), 10)
    n = np.tile(np.arange(10), 30)
    fwd = rng.normal(0.001, 0.02, 300)
    m, _ = split_report(d, n, fwd, fwd, {"model": fwd.copy(), "persistence": rng.normal(0, 0.02, 300)},
                        {"lightgbm": "not installed"}, horizon=1, top_k=None, cost_bps=10, train_label_mean=0.001)
    assert m["model"]["mse"] == 0 and m["model"]["directional_accuracy"] == 1.0
    assert m["model"]["ic"]["mean"] == pytest.approx(1.0) and m["model"]["rank_ic"]["dates"] == 30
    assert m["up_rate"] == pytest.approx(np.mean(fwd > 0))
    assert m["baselines"]["always_up"]["directional_accuracy"] == m["up_rate"]
    assert m["baselines"]["zero_return"]["mse"] == pytest.approx(np.mean(fwd ** 2))
    assert m["baselines"]["lightgbm"] == {"skipped": "not installed"}
    noisy, _ = split_report(d, n, fwd, fwd, {"model": fwd + rng.normal(0, 0.02, 300)}, {}, 1, None, 10, 0.0)
    assert 0 < noisy["model"]["rank_ic"]["mean"] < 1 and noisy["model"]["rank_ic"]["t_nw"] > 2
    assert noisy["verdict"] == "skill" and noisy["long_short_minus_equal_weight"] > 0
    anti, _ = split_report(d, n, fwd, fwd, {"model": -fwd}, {}, 1, None, 10, 0.0)
    assert anti["model"]["rank_ic"]["mean"] == pytest.approx(-1.0) and anti["verdict"] == "no skill detected"


def test_ridge_picks_its_penalty_on_validation_and_lightgbm_is_optional(monkeypatch):
    import torch

    from trainers.forecast import baselines
    from trainers.forecast.config import ForecastConfig
    from trainers.forecast.data import load_store

    store, _ = load_store(ForecastConfig(synthetic_tickers=6, synthetic_days=500, window=10, horizon=5, target="raw"),
                          log=lambda _m: None)
    # a label that is an exact linear function of the window: ridge must find it (small penalty wins)
    w = torch.randn(10, store.features.shape[-1], generator=torch.Generator().manual_seed(0))
    for split in ("train", "val", "test"):
        ids = store.sample_ids[split]
        x, _ = store.gather(ids)
        store.target[ids // 6, ids % 6] = (x * w).sum(dim=(1, 2)) * 0.01
    info, preds = baselines.fit_ridge(store)
    assert info["val_mse"] == min(g["val_mse"] for g in info["grid"]) and info["alpha"] == min(baselines.RIDGE_ALPHAS)
    ids = store.sample_ids["test"]
    truth = store.target[ids // 6, ids % 6].double().numpy()
    assert np.corrcoef(preds["test"], truth)[0, 1] > 0.999
    monkeypatch.setattr(baselines, "lightgbm_available", lambda: False)
    assert baselines.fit_lightgbm(store) == ({"skipped": baselines.LIGHTGBM_MISSING}, {})


def test_a_ruined_book_stays_ruined_and_top_k_reports_what_was_held():
    from trainers.forecast.metrics import performance

    net = np.array([0.1, -1.6, -1.6, 0.5])  # a short losing 160 % twice must not compound into a gain
    p = performance(net, net, np.ones(4), 20)
    assert p["total_return"] == -1.0 and p["ann_return"] == -1.0 and p["max_drawdown"] == -1.0
    rng = np.random.default_rng(0)
    dates, tickers = np.repeat(np.arange(40), 10), np.tile(np.arange(10), 40)
    books = backtest(dates, tickers, rng.normal(size=400), rng.normal(0, 0.01, 400), 20, 100, 10.0)
    assert books["long_short"]["names_held"] == {"min": 5, "max": 5}  # --top-k 100 of 10 names: half of them


def test_cost_bps_has_a_ceiling():
    from trainers.forecast.config import ForecastConfig

    with pytest.raises(UsageError, match="cost-bps"):
        ForecastConfig(cost_bps=20000).validate()
