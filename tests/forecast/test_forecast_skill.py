"""The demo must show learning, and the verdict must say so only when it is there: the same small
synthetic market with its momentum effect (skill) and with the effect set to zero (the control,
where any "skill" would be a bug in the metrics or a leak)."""

import pytest

from trainers.forecast.config import ForecastConfig
from trainers.forecast.train import train

SMALL = dict(synthetic_tickers=16, synthetic_days=700, window=20, horizon=5, epochs=2, batch_size=128, log_every=50)


def run(tmp_path, momentum: float) -> dict:
    return train(ForecastConfig(run_dir=str(tmp_path / f"m{momentum}"), synthetic_momentum=momentum, **SMALL))


@pytest.mark.slow
def test_the_model_finds_the_planted_effect(tmp_path):
    r = run(tmp_path, 0.3)
    test = r["evaluation"]["test"]
    m = test["model"]
    assert m["rank_ic"]["mean"] > 0 and m["rank_ic"]["t_nw"] > 3, m["rank_ic"]
    assert m["long_short"]["ann_return"] > test["equal_weight"]["ann_return"]
    assert test["verdict"] == "skill" and r["data"]["synthetic"] is True
    assert r["training"]["best_val"]["value"] < r["training"]["initial_val"]


@pytest.mark.slow
def test_without_the_effect_there_is_no_skill(tmp_path):
    r = run(tmp_path, 0.0)
    for split in ("val", "test"):
        assert r["evaluation"][split]["verdict"] == "no skill detected", r["evaluation"][split]["verdict_reason"]
    assert "no skill detected" in (tmp_path / "m0.0" / "training.log").read_text().lower()
