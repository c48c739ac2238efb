import numpy as np
import pandas as pd
import pytest
import torch

from trainers.errors import UsageError
from trainers.forecast.data import build_store
from trainers.market.panel import to_panel
from trainers.market.synthetic import synthetic_market
from trainers.market.windows import (
    FEATURES,
    LOOKBACK,
    SPLITS,
    causal_features,
    plan_splits,
)

W, H = 32, 5


@pytest.fixture(scope="module")
def panel():
    return to_panel(synthetic_market(n_tickers=12, n_days=700, seed=3))


@pytest.fixture(scope="module")
def store(panel):
    return build_store(panel, W, H)


def used_dates(store, split):
    """Every date index any sample of the split reads: input rows with their lookback, and target days."""
    t = store.date_index(store.sample_ids[split]).unique().numpy()
    used = set()
    for a in t:
        used.update(range(a - W + 1 - LOOKBACK, a + H + 1))
    return used


def test_no_window_or_target_of_one_split_touches_another(store):
    sets = {s: used_dates(store, s) for s in SPLITS}
    assert not sets["train"] & sets["val"]
    assert not sets["val"] & sets["test"]
    assert not sets["train"] & sets["test"]
    assert max(sets["train"]) < min(sets["val"]) and max(sets["val"]) < min(sets["test"])
    assert store.plan.embargo >= W + H


def test_the_same_dates_for_every_ticker(store):
    for split in SPLITS:
        t = store.date_index(store.sample_ids[split])
        start, stop = store.plan.ranges[split]
        assert t.min() >= start and t.max() < stop


def test_features_are_causal(panel):
    base = causal_features(panel)
    cut = 400
    changed = to_panel(synthetic_market(n_tickers=12, n_days=700, seed=3))
    for a in (changed.close, changed.open, changed.high, changed.low, changed.volume):
        a[cut + 1:] *= np.random.default_rng(0).uniform(0.5, 2.0, a[cut + 1:].shape)
    after = causal_features(changed)
    np.testing.assert_array_equal(np.nan_to_num(base[: cut + 1]), np.nan_to_num(after[: cut + 1]))
    assert not np.allclose(np.nan_to_num(base[cut + 2:]), np.nan_to_num(after[cut + 2:]))


def test_normalisation_uses_training_period_only(panel):
    a = build_store(panel, W, H)
    stop = a.plan.ranges["train"][1]
    changed = to_panel(synthetic_market(n_tickers=12, n_days=700, seed=3))
    changed.volume[stop:] *= 50.0
    changed.close[stop:] *= 3.0
    b = build_store(changed, W, H)
    assert a.feature_mean == b.feature_mean and a.feature_std == b.feature_std


def test_gather_matches_a_window_built_by_hand(store):
    ids = store.sample_ids["val"][:5]
    x, y = store.gather(ids)
    assert x.shape == (5, W, len(FEATURES)) and y.shape == (5,)
    for i, sid in enumerate(ids.tolist()):
        t, n = divmod(sid, store.n_tickers)
        torch.testing.assert_close(x[i], store.features[t - W + 1: t + 1, n])
        assert y[i] == store.target[t, n]


def test_target_is_forward_log_return(panel, store):
    sid = int(store.sample_ids["test"][0])
    t, n = divmod(sid, store.n_tickers)
    expected = np.log(panel.close[t + H, n] / panel.close[t, n])
    assert store.target[t, n].item() == pytest.approx(expected, rel=1e-5)


def test_missing_bars_exclude_only_the_windows_that_need_them():
    frame = synthetic_market(n_tickers=4, n_days=700, seed=1)
    gap_day = frame["date"].unique()[300]
    frame = frame[~((frame["ticker"] == "SYN001") & (frame["date"] == gap_day))]
    p = to_panel(frame)
    s = build_store(p, W, H)
    ids = torch.cat([s.sample_ids[k] for k in SPLITS])
    t, n = ids // s.n_tickers, ids % s.n_tickers
    # the gap spoils feature rows 300..300+LOOKBACK (returns and trailing statistics) and the target of t=300-H
    hit = (n == 1) & (((t >= 300) & (t - W + 1 <= 300 + LOOKBACK)) | (t + H == 300))
    assert not hit.any()
    assert ((n == 1) & (t - W + 1 == 300 + LOOKBACK + 1)).any()
    assert ((n == 1) & (t == 299)).any() and ((n == 0) & (t == 300)).any()


def test_window_longer_than_data_is_a_usage_error(panel):
    with pytest.raises(UsageError, match="--window 900"):
        build_store(panel, 900, H)


def test_too_few_dates_for_three_splits_is_a_usage_error(panel):
    with pytest.raises(UsageError, match="cannot hold train/val/test"):
        build_store(panel, 200, 50)


def test_bad_horizon_is_a_usage_error(panel):
    with pytest.raises(UsageError, match="--horizon 0"):
        build_store(panel, W, 0)


def test_split_plan_arithmetic():
    plan = plan_splits(1000, 20, 5, 0.15, 0.15, 10)
    (a0, a1), (b0, b1), (c0, c1) = (plan.ranges[s] for s in SPLITS)
    assert b0 - a1 == plan.embargo and c0 - b1 == plan.embargo
    assert c1 - 1 == 1000 - 1 - 5
    assert plan.footprint("train", 20, 5)[1] < plan.footprint("val", 20, 5)[0]


def test_duplicate_rows_are_rejected():
    frame = synthetic_market(n_tickers=2, n_days=50, seed=0)
    with pytest.raises(UsageError, match="repeated"):
        to_panel(pd.concat([frame, frame.iloc[:3]]))
