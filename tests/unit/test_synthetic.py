import pandas as pd

from trainers.market.panel import COLUMNS
from trainers.market.synthetic import synthetic_market


def test_deterministic_by_seed_and_labelled():
    a = synthetic_market(8, 300, seed=4)
    b = synthetic_market(8, 300, seed=4)
    c = synthetic_market(8, 300, seed=5)
    pd.testing.assert_frame_equal(a, b)
    assert not a["close"].equals(c["close"])
    assert a.attrs["synthetic"] is True and "synthetic" in a.attrs["source"]
    assert a["ticker"].str.startswith("SYN").all()
    assert tuple(a.columns) == COLUMNS and len(a) == 8 * 300


def test_bars_are_consistent_and_fat_tailed():
    f = synthetic_market(50, 2000, seed=0)
    assert (f["high"] >= f[["open", "close"]].max(axis=1) - 1e-9).all()
    assert (f["low"] <= f[["open", "close"]].min(axis=1) + 1e-9).all()
    assert (f[["open", "high", "low", "close", "volume"]] > 0).all().all()
    r = f.pivot(index="date", columns="ticker", values="close").pipe(lambda p: (p / p.shift()).apply(lambda s: s.map(float)))
    r = r.iloc[1:].stack()
    import numpy as np

    lr = np.log(r.to_numpy())
    kurt = ((lr - lr.mean()) ** 4).mean() / lr.var() ** 2
    assert kurt > 4.0  # normal returns have kurtosis 3
    # volatility clustering: |returns| are autocorrelated
    absr = np.abs(np.log(f.pivot(index="date", columns="ticker", values="close")).diff().iloc[1:]).mean(axis=1)
    assert absr.autocorr(1) > 0.1
