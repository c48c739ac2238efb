"""The vectorised portfolio environment against a plain one-environment NumPy implementation, its
random streams, and the causality of its features."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainers.errors import UsageError
from trainers.market.panel import to_panel
from trainers.market.synthetic import synthetic_market
from trainers.ppo.env import DeviceMarket, EnvSpec, VecPortfolioEnv, env_keys, uniform_u32
from trainers.ppo.features import FEATURES, WARMUP, build_trading_data, indicators

# ---- the reference: one environment, loops, NumPy ------------------------------------------------
M32 = (1 << 32) - 1


def ref_fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def ref_start(key: int, counter: int, first: int, n_starts: int) -> int:
    u = ref_fmix32(key ^ ref_fmix32((counter * 2 + 1) & M32))
    return first + (u * n_starts >> 32)


class ReferencePortfolio:
    """The rules of env.py written out for one portfolio, stock by stock."""

    def __init__(self, close: np.ndarray, spec: EnvSpec, key: int, first: int, n_starts: int):
        self.close, self.spec, self.key, self.first, self.n_starts = close, spec, key, first, n_starts
        self.c = spec.cost_bps / 1e4
        self.counter = 0
        self.reset()

    def reset(self):
        self.t = ref_start(self.key, self.counter, self.first, self.n_starts)
        self.counter += 1
        self.cash, self.shares, self.steps = self.spec.initial_cash, np.zeros(self.close.shape[1]), 0

    def value(self, t):
        return self.cash + sum(s * p for s, p in zip(self.shares, self.close[t]))

    def step(self, action: np.ndarray):
        price, n = self.close[self.t], len(self.shares)
        v0 = self.value(self.t)
        desired = np.zeros(n)
        if self.spec.action == "trades":
            for i in range(n):
                desired[i] = math.trunc(action[i] * self.spec.h_max)
        else:
            w = (action + 1) / 2
            total = sum(w)
            for i in range(n):
                desired[i] = (w[i] / max(total, 1.0)) * v0 / price[i] - self.shares[i]
        sells = np.array([min(max(-d, 0.0), s) for d, s in zip(desired, self.shares)])
        buys = np.array([max(d, 0.0) for d in desired])
        cash = self.cash + sum(sells * price) * (1 - self.c)
        need = sum(buys * price) * (1 + self.c)
        if need > cash:
            buys = buys * (cash / need)
        if self.spec.action == "trades":
            buys = np.floor(buys)
        cost = (sum(sells * price) + sum(buys * price)) * self.c
        self.cash = max(cash - sum(buys * price) * (1 + self.c), 0.0)
        self.shares = self.shares - sells + buys
        trades = int((sells > 0).sum() + (buys > 0).sum())
        self.t += 1
        v1 = self.value(self.t)
        reward = (v1 - v0) * self.spec.reward_scale if self.spec.reward == "pnl" else math.log(v1 / v0)
        self.steps += 1
        done = self.steps >= self.spec.episode_days
        out = {"value": v1, "cost": cost, "trades": trades, "reward": reward, "done": done, "t": self.t}
        if done:
            self.reset()
        return out


def small_market(n_stocks=4, days=300, seed=3):
    rng = np.random.default_rng(seed)
    close = 50 * np.exp(np.cumsum(rng.normal(0.0003, 0.02, (days, n_stocks)), 0)) * rng.uniform(0.3, 3, n_stocks)
    feats = rng.normal(size=(days, n_stocks, 3)).astype(np.float32)
    return close, feats


@pytest.mark.parametrize("action,reward,cost", [("trades", "pnl", 10.0), ("weights", "log_return", 25.0),
                                                ("weights", "pnl", 0.0), ("trades", "log_return", 5.0)])
def test_environment_equals_the_numpy_reference_over_random_actions(action, reward, cost):
    close, feats = small_market()
    spec = EnvSpec(window=5, episode_days=17, action=action, h_max=300, initial_cash=100_000, cost_bps=cost,
                   reward=reward, reward_scale=1e-3)
    n_envs, train = 6, (10, 200)
    env = VecPortfolioEnv(DeviceMarket(close, feats, torch.device("cpu")), spec, n_envs, train, seed=11, rank=1)
    keys = env_keys(11, 1, n_envs).tolist()
    refs = [ReferencePortfolio(close, spec, keys[b], env.first_start, env.n_starts) for b in range(n_envs)]
    rng = np.random.default_rng(0)
    episodes = 0
    for _ in range(60):  # 3.5 episodes each: resets inside
        # actions in [-1, 1], with exact zeros, full buys and full sells mixed in
        a = rng.choice([-1.0, 0.0, 1.0, 0.3, -0.45], size=(n_envs, 4)) if rng.random() < 0.3 else rng.uniform(-1, 1, (n_envs, 4))
        (t, portfolio), r, done, info = env.step(torch.from_numpy(a))
        for b, ref in enumerate(refs):
            want = ref.step(a[b])
            assert info["value"][b].item() == pytest.approx(want["value"], rel=1e-12)
            assert info["cost"][b].item() == pytest.approx(want["cost"], rel=1e-12, abs=1e-9)
            assert info["trades"][b].item() == want["trades"]
            assert r[b].item() == pytest.approx(want["reward"], rel=1e-6, abs=1e-9)  # float32 reward
            assert bool(done[b]) == want["done"]
            assert t[b].item() == ref.t  # after a reset: the new episode's start, from the same stream
            assert env.cash[b].item() == pytest.approx(ref.cash, rel=1e-12, abs=1e-9)
            np.testing.assert_allclose(env.shares[b].numpy(), ref.shares, rtol=1e-12, atol=1e-12)
            assert env.cash[b].item() >= 0 and (env.shares[b] >= 0).all()  # no borrowing, no shorting
        episodes += int(done.sum())
    assert episodes == n_envs * 3  # exact boundaries: every 17 steps


def test_episode_statistics_are_those_of_the_finished_episode():
    close, feats = small_market()
    spec = EnvSpec(window=5, episode_days=4, action="weights", cost_bps=10)
    env = VecPortfolioEnv(DeviceMarket(close, feats, torch.device("cpu")), spec, 3, (10, 200), seed=0)
    total_reward, total_cost = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    for i in range(4):
        _obs, r, done, info = env.step(torch.full((3, 4), 0.5 if i % 2 else -0.2, dtype=torch.float64))
        total_cost += info["cost"]
        total_reward += (info["value"] - info["value_before"]) * spec.reward_scale
    ep = info["episode"]
    assert done.all() and torch.allclose(ep["cost"], total_cost) and torch.allclose(ep["reward"], total_reward)
    assert torch.allclose(ep["return"], info["value"] / spec.initial_cash - 1)
    assert (env.steps == 0).all() and (env.cash == spec.initial_cash).all() and (env.shares == 0).all()


def test_each_environment_has_its_own_stream_independent_of_the_others():
    keys8, keys4 = env_keys(5, 0, 8), env_keys(5, 0, 4)
    assert torch.equal(keys8[:4], keys4) and len(set(keys8.tolist())) == 8
    assert not torch.equal(env_keys(5, 1, 4), keys4) and not torch.equal(env_keys(6, 0, 4), keys4)
    draws = uniform_u32(keys8[:, None].expand(8, 2000), torch.arange(2000).expand(8, 2000))
    u = draws.double() / 2**32
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005  # uniform
    assert all(ref_fmix32(k ^ ref_fmix32(1)) == d for k, d in zip(keys8.tolist(), draws[:, 0].tolist()))
    close, feats = small_market()
    env = VecPortfolioEnv(DeviceMarket(close, feats, torch.device("cpu")), EnvSpec(window=5, episode_days=20), 64, (10, 200), 0)
    starts = env.t
    assert starts.min() >= 10 and starts.max() <= 180 and len(set(starts.tolist())) > 30  # own random dates


def test_state_dict_round_trip_continues_exactly():
    close, feats = small_market()
    spec = EnvSpec(window=5, episode_days=7, action="trades")
    market = DeviceMarket(close, feats, torch.device("cpu"))
    a = VecPortfolioEnv(market, spec, 5, (10, 200), seed=2)
    actions = [torch.rand(5, 4, generator=torch.Generator().manual_seed(i)) * 2 - 1 for i in range(20)]
    for x in actions[:9]:
        a.step(x)
    b = VecPortfolioEnv(market, spec, 5, (10, 200), seed=99)
    b.load_state_dict(a.state_dict())
    for x in actions[9:]:
        (ta, pa), ra, _, _ = a.step(x)
        (tb, pb), rb, _, _ = b.step(x)
        assert torch.equal(ta, tb) and torch.equal(pa, pb) and torch.equal(ra, rb)


def test_bad_environment_settings_are_usage_errors():
    close, feats = small_market()
    market = DeviceMarket(close, feats, torch.device("cpu"))
    with pytest.raises(UsageError, match="longer than the training period"):
        VecPortfolioEnv(market, EnvSpec(window=5, episode_days=500), 2, (10, 200), 0)
    with pytest.raises(UsageError, match="--cost-bps"):
        VecPortfolioEnv(market, EnvSpec(window=5, episode_days=5, cost_bps=-1), 2, (10, 200), 0)
    with pytest.raises(UsageError, match="--cost-bps"):
        VecPortfolioEnv(market, EnvSpec(window=5, episode_days=5, cost_bps=float("nan")), 2, (10, 200), 0)


def test_features_are_causal_and_normalised_with_training_statistics_only():
    frame = synthetic_market(n_tickers=5, n_days=700, seed=1)
    panel = to_panel(frame)
    base = indicators(panel.close, panel.high, panel.low)
    cut = 400
    changed = panel.close.copy()
    changed[cut:] *= np.linspace(1, 3, len(changed) - cut)[:, None]  # rewrite the future
    after = indicators(changed, panel.high, panel.low)
    np.testing.assert_array_equal(base[:cut], after[:cut])
    assert not np.allclose(base[cut:], after[cut:], equal_nan=True)
    assert base.shape == (700, 5, len(FEATURES)) and np.isfinite(base[WARMUP:]).all()

    data, _ = build_trading_data(panel, 5, 20, 0.15, 0.15, 20)
    train_stop = data.splits["train"][1]
    # the z-scores use rows up to the training period's last decision date: changing later prices
    # changes no statistic
    late = panel.close.copy()
    late[WARMUP + train_stop + 5:] *= 1.5
    panel2 = to_panel(frame.assign(close=late.ravel()))
    data2, _ = build_trading_data(panel2, 5, 20, 0.15, 0.15, 20)
    assert data.feature_mean == data2.feature_mean and data.feature_std == data2.feature_std
    a, b = data.splits["train"], data.splits["val"]
    assert b[0] - a[1] >= 20  # embargo between the parts


def test_too_few_stocks_and_too_long_windows_are_refused():
    panel = to_panel(synthetic_market(n_tickers=3, n_days=400, seed=1))
    with pytest.raises(UsageError, match="must be >= 2"):
        build_trading_data(panel, 1, 10, 0.15, 0.15, 20)
    with pytest.raises(UsageError):
        build_trading_data(panel, 3, 300, 0.15, 0.15, 20)
    frame = synthetic_market(n_tickers=3, n_days=400, seed=1)
    frame.loc[frame["ticker"] != "SYN000", "close"] = np.nan  # only one complete stock
    with pytest.raises(UsageError, match="--num-stocks 3: the data holds 1 stock"):
        build_trading_data(to_panel(frame), 3, 10, 0.15, 0.15, 20)
