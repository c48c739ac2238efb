import numpy as np
import pytest

from trainers.forecast.evaluate import forecast_metrics


def test_metrics_and_baselines_on_known_rows():
    rng = np.random.default_rng(0)
    dates = np.repeat(np.arange(30), 10)
    target = rng.normal(0.001, 0.02, 300)
    past = rng.normal(0, 0.02, 300)
    m = forecast_metrics(dates, target.copy(), target, past, train_target_mean=0.001)
    assert m["model"]["mse"] == 0 and m["model"]["directional_accuracy"] == 1.0
    assert m["model"]["ic_mean"] == pytest.approx(1.0) and m["model"]["ic_dates"] == 30
    assert m["up_rate"] == pytest.approx(np.mean(target > 0))
    assert m["baselines"]["always_up"]["directional_accuracy"] == m["up_rate"]
    assert m["baselines"]["zero_return"]["mse"] == pytest.approx(np.mean(target ** 2))
    assert m["baselines"]["persistence"]["directional_accuracy"] == pytest.approx(np.mean((past > 0) == (target > 0)))
    anti = forecast_metrics(dates, -target, target, past, 0.0)
    assert anti["model"]["ic_mean"] == pytest.approx(-1.0)


def test_ic_skips_dates_with_too_few_names():
    dates = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    y = np.arange(8.0)
    m = forecast_metrics(dates, y, y, y, 0.0)
    assert m["model"]["ic_dates"] == 1
