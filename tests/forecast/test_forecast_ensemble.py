"""The ensemble row (the equal-weight rank average of the model, ridge and LightGBM) and the paired
model-minus-baseline comparison, against hand computations and through the real evaluation."""

import numpy as np
import pandas as pd
import pytest
import torch

from trainers.forecast.metrics import newey_west_t, paired_difference, per_date_ic, rank_average


def test_rank_average_by_hand():
    # date 0: (1, 2, 3) and (3, 2, 1) rank to (-1, 0, 1) and (1, 0, -1): they cancel. date 1: (5, 5, 1)
    # ranks (2.5, 2.5, 1) -> (0.5, 0.5, -1), (0, 1, 2) -> (-1, 0, 1); mean (-0.25, 0.25, 0). date 2: one row, 0.
    d = np.array([0, 0, 0, 1, 1, 1, 2])
    a = np.array([1, 2, 3, 5, 5, 1, 7.0])
    b = np.array([3, 2, 1, 0, 1, 2, -4.0])
    np.testing.assert_allclose(rank_average(d, [a, b]), [0, 0, 0, -0.25, 0.25, 0, 0])
    # ranks only: a member in other units (a return, a score 1000 times larger, its cube) weighs the same
    np.testing.assert_allclose(rank_average(d, [a * 1000, b ** 3]), rank_average(d, [a, b]))
    np.testing.assert_allclose(rank_average(d, [a]), [-1, 0, 1, 0.5, 0.5, -1, 0])


def test_paired_difference_is_the_mean_gap_on_common_dates_with_its_newey_west_error():
    a = pd.Series([0.3, 0.1, 0.2, 0.4, 0.0], index=[0, 1, 2, 3, 4])
    b = pd.Series([0.1, 0.1, 0.0, 0.1, 9.0], index=[0, 1, 2, 3, 7])  # date 4 and 7: one side only
    got = paired_difference(a, b, horizon=2)
    diff = np.array([0.2, 0.0, 0.2, 0.3])
    assert got["dates"] == 4 and got["mean"] == pytest.approx(diff.mean())
    assert got["t_nw"] == pytest.approx(newey_west_t(diff, 1))
    assert got["se_nw"] == pytest.approx(diff.mean() / newey_west_t(diff, 1))
    # pairing removes what both share: two forecasts that swing together by date differ by little
    rng = np.random.default_rng(0)
    common = pd.Series(rng.normal(0, 0.2, 300))
    close = paired_difference(common + 0.01 + rng.normal(0, 0.001, 300), common, horizon=1)
    assert close["mean"] == pytest.approx(0.01, abs=3e-4) and close["se_nw"] < 1e-4  # unpaired: about 0.016


@pytest.fixture(scope="module")
def evaluated():
    from trainers.forecast.build import build_model
    from trainers.forecast.config import ForecastConfig
    from trainers.forecast.data import load_store
    from trainers.forecast.evaluate import evaluate_splits
    from trainers.runtime.rundir import single_process_context

    cfg = ForecastConfig(synthetic_tickers=8, synthetic_days=520, window=10, horizon=5, synthetic_momentum=0.3,
                         linear_skip=True)
    store, _ = load_store(cfg, log=lambda _m: None)
    torch.manual_seed(0)
    model = build_model(cfg, store)
    with torch.no_grad():  # a model that is not trained, yet forecasts: random weights on its skip
        model.skip.weight.normal_(0, 0.05)
    evaluation, series = evaluate_splits(model, store, single_process_context(), 256, None, 10.0)
    return store, model, evaluation, series


def test_the_ensemble_is_the_rank_average_of_model_ridge_and_lightgbm(evaluated):
    from trainers.forecast.baselines import fit_lightgbm, fit_ridge
    from trainers.forecast.evaluate import predict_split
    from trainers.runtime.rundir import single_process_context

    store, model, evaluation, series = evaluated
    assert evaluation["ensemble_members"] == ["model", "ridge", "lightgbm"]
    _, ridge = fit_ridge(store)
    _, lightgbm = fit_lightgbm(store)
    for split in ("val", "test"):
        ids, pred = predict_split(model, store, split, single_process_context(), 256)
        t, n = ids // store.n_tickers, ids % store.n_tickers
        ensemble = rank_average(t, [pred.astype(np.float64), ridge[split], lightgbm[split]])
        expected = per_date_ic(t, ensemble, store.forward_return[t, n], rank=True)
        got = evaluation[split]["baselines"]["ensemble"]
        assert got["rank_ic"]["mean"] == pytest.approx(expected.mean())
        pd.testing.assert_series_equal(series[split]["ensemble"]["rank_ic"], expected)
        # its scores are ranks, not the label: no MSE or directional accuracy is claimed for it
        assert got["mse"] is None and got["directional_accuracy"] is None
        # the model's Rank IC minus each other row's, date by date
        diffs = evaluation[split]["model_minus_rank_ic"]
        assert set(diffs) == {"ridge", "lightgbm", "persistence", "ensemble"}
        model_ric = series[split]["model"]["rank_ic"]
        assert diffs["ensemble"]["mean"] == pytest.approx((model_ric - expected).dropna().mean())


def test_without_lightgbm_the_ensemble_averages_model_and_ridge(monkeypatch):
    from trainers.forecast import baselines
    from trainers.forecast.build import build_model
    from trainers.forecast.config import ForecastConfig
    from trainers.forecast.data import load_store
    from trainers.forecast.evaluate import evaluate_splits
    from trainers.forecast.report import markdown
    from trainers.runtime.rundir import single_process_context

    monkeypatch.setattr(baselines, "lightgbm_available", lambda: False)
    cfg = ForecastConfig(synthetic_tickers=8, synthetic_days=520, window=10, horizon=5)
    store, _ = load_store(cfg, log=lambda _m: None)
    evaluation, _ = evaluate_splits(build_model(cfg, store), store, single_process_context(), 256, None, 10.0)
    assert evaluation["ensemble_members"] == ["model", "ridge"]
    assert "skipped" in evaluation["test"]["baselines"]["lightgbm"] and "ensemble" in evaluation["test"]["baselines"]
    text = markdown({"evaluation": {**evaluation, "checkpoint_step": 1}, "config": {"horizon": 5}}, "none")
    assert "| ensemble |" in text and "within-date ranks of: model, ridge;" in text


def test_the_evaluation_scores_in_fp32_where_bf16_would_tie_names_in_rank():
    """bf16 keeps 8 bits of mantissa: a model trained under bf16 autocast (every GPU deploy) and scored
    under it too gives many names of a date the same score, and Rank IC and the top-k portfolios then
    rank ties instead of forecasts. The evaluation scores in fp32 whatever the training precision."""
    from trainers.forecast.build import build_model
    from trainers.forecast.config import ForecastConfig
    from trainers.forecast.data import load_store
    from trainers.forecast.evaluate import predict_split
    from trainers.runtime.rundir import single_process_context

    cfg = ForecastConfig(synthetic_tickers=64, synthetic_days=400, window=10, horizon=5, precision="bf16")
    store, _ = load_store(cfg, log=lambda _m: None)
    torch.manual_seed(0)
    model = build_model(cfg, store).eval()
    ids, pred = predict_split(model, store, "test", single_process_context(), 256)
    model.eval()  # (predict_split leaves it training)
    with torch.no_grad():
        x, _ = store.gather(torch.from_numpy(ids))
        fp32 = model.predict_return(x).float().numpy()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model.predict_return(x).float().numpy()
    dates = ids // store.n_tickers

    def ties(scores: np.ndarray) -> int:
        return sum(int((dates == d).sum()) - len(np.unique(scores[dates == d])) for d in np.unique(dates))

    np.testing.assert_array_equal(pred, fp32)
    assert ties(pred) == 0 and ties(bf16) > len(np.unique(dates))  # under bf16: more than one tie a date
