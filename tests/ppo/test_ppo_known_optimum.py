"""The continuous-action check: the real trainer on a market whose best policy is known.

Stock 0 rises 0.4 % a day with little noise; the others fall 0.1 % a day with more noise. With target
weights and a log-return reward the optimum is to hold stock 0 only. The agent, trained through
`trainers ppo train` on a user file, must find it: its test return is compared with the optimum's.
Snapshots are chosen by validation return (Sharpe would not tell half-in-cash from all-in).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainers.ppo.config import PpoConfig
from trainers.ppo.train import train


def drift_market(path, days=700, seed=0):
    rng = np.random.default_rng(seed)
    log_ret = np.stack([0.004 + 0.004 * rng.standard_normal(days), -0.001 + 0.01 * rng.standard_normal(days),
                        -0.001 + 0.01 * rng.standard_normal(days)], 1)
    close = 100 * np.exp(np.cumsum(log_ret, 0))
    dates = pd.bdate_range("2010-01-04", periods=days)
    rows = []
    for i, ticker in enumerate(["DRIFT", "FLATA", "FLATB"]):
        c = close[:, i]
        o = np.r_[c[0], c[:-1]]
        rows.append(pd.DataFrame({"date": dates, "ticker": ticker, "open": o, "high": np.maximum(o, c) * 1.002,
                                  "low": np.minimum(o, c) * 0.998, "close": c, "volume": 1e6}))
    pd.concat(rows).to_csv(path, index=False)
    return close


def test_ppo_reaches_the_known_optimum_of_a_drifting_market(tmp_path):
    close = drift_market(tmp_path / "drift.csv")
    cfg = PpoConfig(run_dir=str(tmp_path / "run"), source=f"file:{tmp_path / 'drift.csv'}", num_stocks=3, window=5,
                    min_history_days=100, episode_days=40, num_envs=32, rollout_steps=20, batch_size=320,
                    total_steps=122_880, action="weights", reward="log_return", cost_bps=10, encoder="mlp",
                    hidden=32, lr=3e-3, ent_coef=0.0, seeds=1, baseline_mlp=False, eval_every=4, device="cpu",
                    random_runs=3, gamma=0.9, init_std=0.6)
    results = train(cfg)
    table = results["evaluation"]["table"]
    agent = table["ppo_mlp"]["per_seed"][0]
    dates = [d.strftime("%Y-%m-%d") for d in pd.bdate_range("2010-01-04", periods=len(close))]
    first, last = (dates.index(d) for d in results["evaluation"]["test_dates"])
    assert last - first == agent["days"]
    optimum = close[last, 0] / close[first, 0] - 1  # hold DRIFT only, no cost
    bh = table["buy_and_hold_equal_weight"]["per_seed"][0]["cumulative_return"]
    assert optimum > 0.2 and bh < 0.8 * optimum
    # the agent holds (almost) only the drifting stock: within 15 % of the optimum's log return (87 % was
    # measured at this budget, 91.5 % at twice it: tanh saturates as the weight approaches 1)
    assert np.log1p(agent["cumulative_return"]) >= 0.85 * np.log1p(optimum), (agent, optimum)
    assert agent["cumulative_return"] > table["random_policy"]["summary"]["cumulative_return"]["mean"]
    assert "beats equal-weight buy-and-hold" in results["evaluation"]["verdict"]
    assert results["evaluation"]["table"]["ppo_mlp"]["per_seed"][0]["selected_update"] is not None
