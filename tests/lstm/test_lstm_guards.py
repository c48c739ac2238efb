"""Which bars a symbol's model reads and which return its backtest earns, checked where the
evaluation uses them. test_lstm_features.py proves the features causal and the label forward; the
long/flat backtest and the window gather had no test that would notice a shift of one bar (the
strategy earning the bar that just closed, a return the model has already seen: tests/leaks/)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from trainers.lstm.bars import Bars, base_timeframe, calendar_of
from trainers.lstm.build import build_model
from trainers.lstm.config import LstmConfig, resolve_timeframes
from trainers.lstm.evaluate import evaluate_symbol
from trainers.lstm.features import build_symbol_data


def symbol_data(horizon: int = 1):
    ts = pd.bdate_range("2015-01-05", periods=700).to_numpy(dtype="datetime64[ns]")
    rng = np.random.default_rng(4)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, len(ts))))
    open_ = close * np.exp(rng.normal(0, 0.003, len(ts)))
    high, low = np.maximum(open_, close) * 1.002, np.minimum(open_, close) * 0.998
    bars = Bars("GUARD", ts, open_, high, low, close, rng.uniform(1e5, 1e6, len(ts)), base_timeframe(ts, "GUARD"),
                calendar_of(ts))
    cfg = LstmConfig(window=8, horizon=horizon, min_split_bars=20, hidden=4, layers=1)
    return bars, cfg, build_symbol_data(bars, cfg, resolve_timeframes("1d,1w", bars.base))


@pytest.mark.parametrize("horizon", [1, 3])
def test_each_anchor_earns_the_return_of_the_bar_after_it(horizon):
    bars, _cfg, data = symbol_data(horizon)
    for split in ("val", "test"):
        k = data.trade_ids[split]
        np.testing.assert_allclose(data.ret_1[k], np.log(bars.close[k + 1] / bars.close[k]), rtol=1e-12)


def test_the_long_flat_backtest_earns_the_next_bar_not_the_one_just_closed():
    """A real DirectionLSTM whose head says "up" for every window (zero weights, a large bias) holds
    the stock from the first anchor's close to the bar after the last anchor: its log return is
    log(close[last + 1] / close[first]) less one entry cost, whatever the window held."""
    bars, cfg, data = symbol_data()
    model = build_model(cfg, data.n_features)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.fill_(50.0)
    evaluation = evaluate_symbol(model, data, batch_size=256, cost_bps=cfg.cost_bps, bins=4)
    for split in ("val", "test"):
        k = data.trade_ids[split]
        assert np.all(np.diff(k) == 1), "the test needs an unbroken run of anchors"
        strategy = evaluation[split]["strategy"]["long_flat"]
        assert strategy["exposure"] == 1.0 and strategy["position_changes"] == 1
        held = np.log(bars.close[k[-1] + 1] / bars.close[k[0]]) + np.log1p(-cfg.cost_bps / 1e4)
        assert strategy["total_log_return"] == pytest.approx(held, rel=1e-9), split


def test_a_window_is_the_anchors_bar_and_the_ones_before_it_and_its_label_the_anchors():
    _bars, cfg, data = symbol_data()
    anchors = data.ids["test"][:6]
    x, y = data.gather(anchors)
    assert x.shape == (6, cfg.window, data.n_features)
    for i, a in enumerate(anchors.tolist()):
        assert torch.equal(x[i], data.features[a - cfg.window + 1: a + 1])  # the last row: the anchor's own bar
        assert torch.equal(y[i], data.label[a])


@pytest.mark.parametrize("dead_zone", [0.0, 0.004])
def test_one_pass_over_a_splits_windows_scores_the_labelled_ones_and_trades_every_one(dead_zone):
    """The evaluation runs the model once over the union of a split's labelled anchors and its trading
    anchors (a dead zone leaves some unlabelled): its metrics are the labelled windows' own, its backtest
    every window's, exactly as two separate passes would give."""
    from trainers.lstm.evaluate import bars_per_year, predict_logits
    from trainers.lstm.metrics import classification_metrics, long_flat_strategy

    bars, cfg, _ = symbol_data()
    cfg = LstmConfig(window=8, horizon=1, min_split_bars=20, hidden=4, layers=1, dead_zone=dead_zone)
    data = build_symbol_data(bars, cfg, resolve_timeframes("1d,1w", bars.base))
    torch.manual_seed(0)
    model = build_model(cfg, data.n_features)
    evaluation = evaluate_symbol(model, data, batch_size=64, cost_bps=cfg.cost_bps, bins=4)
    for split in ("val", "test"):
        labelled, trade = data.ids[split], data.trade_ids[split]
        assert (len(labelled) < len(trade)) == (dead_zone > 0)
        p = torch.sigmoid(predict_logits(model, data, labelled, 64)).double().numpy()
        want = classification_metrics(data.label[labelled].double().numpy(), p, data.train_up_rate, 4)
        for key in ("log_loss", "accuracy", "roc_auc", "brier"):
            assert evaluation[split]["model"][key] == pytest.approx(want["model"][key], abs=1e-12), (split, key)
        p_trade = torch.sigmoid(predict_logits(model, data, torch.from_numpy(trade), 64)).double().numpy()
        strategy = long_flat_strategy(p_trade, data.ret_1[trade], cfg.cost_bps, bars_per_year(data.ts))
        assert evaluation[split]["strategy"]["long_flat"] == pytest.approx(strategy["long_flat"], abs=1e-12)
