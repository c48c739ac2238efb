"""The point-in-time universe at its edges. test_forecast_data.py checks real S&P 500 spells through
a whole store, where a day of membership too many can fall into an embargo or a window's warm-up and
go unseen: a company counted one day before it joined passed it (tests/leaks/ showed it). Here each
spell's first and last day are checked directly."""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainers.market.pit import membership_mask


def test_a_member_counts_from_the_day_it_joins_to_the_day_before_it_leaves():
    history = pd.DataFrame({"symbol": ["AAA", "BBB", "BBB", "CCC"],
                            "added": pd.to_datetime(["2020-01-07", "2019-01-01", "2020-01-09", "2020-01-06"]),
                            "removed": pd.to_datetime(["2020-01-10", "2020-01-07", None, None])})
    dates = pd.bdate_range("2020-01-06", "2020-01-14")  # Mon 6 .. Tue 14 (no weekend bars)
    mask = membership_mask(history, dates, ["AAA", "BBB", "CCC", "ZZZ"])
    day = {d.strftime("%d"): i for i, d in enumerate(dates)}
    member = lambda col: sorted(d for d, i in day.items() if mask[i, col])  # noqa: E731
    assert member(0) == ["07", "08", "09"]  # joined Tuesday 7th, removed Friday 10th: not a member that day
    # BBB left on the 7th and came back on the 9th: the 7th and 8th are outside both spells
    assert member(1) == ["06", "09", "10", "13", "14"]
    assert member(2) == ["06", "07", "08", "09", "10", "13", "14"]  # still a member: no end
    assert not mask[:, 3].any()  # never a member
    assert mask.dtype == np.bool_ and mask.shape == (len(dates), 4)


def test_the_ridge_baseline_never_reads_a_test_label():
    """Ridge is fitted on the training rows and its penalty chosen on validation: rewriting every test
    label changes neither its validation grid nor any prediction. (test_forecast_metrics.py plants a
    label that is the same linear function in every split, so a ridge fitted on test rows too, or
    tuned on them, passed it.)"""
    import torch

    from trainers.forecast.baselines import fit_ridge
    from trainers.forecast.config import ForecastConfig
    from trainers.forecast.data import load_store

    store, _ = load_store(ForecastConfig(synthetic_tickers=6, synthetic_days=500, window=10, horizon=5),
                          log=lambda _m: None)
    info, preds = fit_ridge(store)
    ids = store.sample_ids["test"]
    store.target[store.date_index(ids), ids % store.n_tickers] = torch.randn(len(ids)) * 5.0
    again, again_preds = fit_ridge(store)
    assert again["grid"] == info["grid"] and again["alpha"] == info["alpha"]
    for split in ("val", "test"):
        assert np.array_equal(again_preds[split], preds[split]), split
