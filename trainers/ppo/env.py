"""Many portfolios at once, as tensors: B environments stepped together, no Python loop over them.

Each environment holds cash and whole (trades) or fractional (weights) shares of N stocks. At
decision date t it sees the feature window ending at t and its own holdings, trades at day t's
close, and is valued at day t+1's close. One step, for every environment at once:

    value_before = cash + shares . close[t]
    desired      trades: trunc(action * h_max) shares    weights: w = (action + 1) / 2, scaled to
                 sum <= 1 (the rest is cash); desired = w * value_before / close[t] - shares
    sells        min(-desired, shares) where desired < 0     (no short selling)
    buys         desired where > 0, all scaled by one factor when cash (after sells, net of costs)
                 cannot pay for them (no borrowing); trades mode rounds the scaled buys down
    cash         += sells . close[t] * (1 - c) - buys . close[t] * (1 + c),  c = cost_bps / 1e4
    reward       (value_after - value_before) * reward_scale, or log(value_after / value_before)

An episode lasts `episode_days` decisions from a start date drawn uniformly from the training
period by the environment's own random stream (a counter-based hash of its key: the draws of
environment b do not depend on B or on any other environment, and the state is two integers).
A finished environment resets in the same step: the observation returned is its new episode's
first, and the episode's statistics are reported in that step's `info`.
The whole state is a dict of tensors (`state_dict`), saved in each rank's checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trainers.errors import UsageError
from trainers.runtime.device import to_device

ACTIONS = ("trades", "weights")
REWARDS = ("pnl", "log_return")

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for 0 <= x < 2^32 in int64, without overflowing int64 (split c in halves)."""
    hi, lo = c >> 16, c & 0xFFFF
    return ((((x * hi) & 0xFFFF) << 16) + x * lo) & _MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser: a bijection of 32-bit values that mixes every bit."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniform_u32(key: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """A 32-bit draw per environment from (key, counter): the stream is a pure function of both."""
    return _fmix32(key ^ _fmix32((counter * 2 + 1) & _MASK32))


def env_keys(seed: int, rank: int, n: int) -> torch.Tensor:
    """Distinct 32-bit keys for environments 0..n-1 of `rank` under `seed` (SplitMix64 of the id)."""
    ids = (np.uint64(seed) * np.uint64(1_000_003) + np.uint64(rank)) * np.uint64(1 << 24) + np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = ids + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return torch.from_numpy((z & np.uint64(_MASK32)).astype(np.int64))


@dataclass(frozen=True)
class EnvSpec:
    window: int
    episode_days: int
    action: str = "trades"
    h_max: float = 100.0
    initial_cash: float = 1_000_000.0
    cost_bps: float = 10.0
    reward: str = "pnl"
    reward_scale: float = 1e-4

    def check(self) -> None:
        if self.action not in ACTIONS:
            raise UsageError(f"--action {self.action!r} is not one of: {', '.join(ACTIONS)}")
        if self.reward not in REWARDS:
            raise UsageError(f"--reward {self.reward!r} is not one of: {', '.join(REWARDS)}")
        for name, value, ok in (("--cost-bps", self.cost_bps, self.cost_bps >= 0),
                                ("--initial-cash", self.initial_cash, self.initial_cash > 0),
                                ("--h-max", self.h_max, self.h_max >= 1),
                                ("--reward-scale", self.reward_scale, self.reward_scale > 0)):
            if not (np.isfinite(value) and ok):
                raise UsageError(f"{name} {value} is not allowed")


class DeviceMarket:
    """Prices and features on the device; a window of features gathered by date index."""

    def __init__(self, close: np.ndarray, features: np.ndarray, device: torch.device):
        self.close = torch.as_tensor(close, dtype=torch.float64, device=device)  # [T, N]
        self.features = torch.as_tensor(features, dtype=torch.float32, device=device)  # [T, N, F]
        self.device = device

    @property
    def n_stocks(self) -> int:
        return self.close.shape[1]

    @property
    def n_features(self) -> int:
        return self.features.shape[2]

    def windows(self, t: torch.Tensor, window: int) -> torch.Tensor:
        """[B, window, N, F]: feature rows t-window+1..t for each date index in t [B]."""
        rows = t[:, None] + torch.arange(1 - window, 1, device=t.device)[None, :]
        return self.features[rows]


class VecPortfolioEnv:
    """B portfolios on one market, stepped together. Observations: (date index [B] int64,
    portfolio [B, N+1] float32 = value weights of each stock and of cash)."""

    def __init__(self, market: DeviceMarket, spec: EnvSpec, num_envs: int, start_range: tuple[int, int], seed: int,
                 rank: int = 0):
        spec.check()
        lo, hi = start_range  # decisions may fall on dates lo..hi-1
        if spec.episode_days > hi - lo:
            raise UsageError(f"--episode-days {spec.episode_days} is longer than the training period "
                             f"({hi - lo} decision dates)")
        if lo < spec.window - 1:
            raise UsageError(f"the first decision date {lo} has no full window of {spec.window} days")
        self.market, self.spec, self.num_envs = market, spec, num_envs
        self.first_start, self.n_starts = lo, hi - lo - spec.episode_days + 1
        self.cost = spec.cost_bps / 1e4
        dev = market.device
        n = market.n_stocks
        self.key = to_device(env_keys(seed, rank, num_envs), dev)
        self.counter = torch.zeros(num_envs, dtype=torch.int64, device=dev)
        self.t = torch.zeros(num_envs, dtype=torch.int64, device=dev)
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=dev)
        self.cash = torch.zeros(num_envs, dtype=torch.float64, device=dev)
        self.shares = torch.zeros(num_envs, n, dtype=torch.float64, device=dev)
        self.ep_reward = torch.zeros(num_envs, dtype=torch.float64, device=dev)
        self.ep_cost = torch.zeros(num_envs, dtype=torch.float64, device=dev)
        self.ep_trades = torch.zeros(num_envs, dtype=torch.int64, device=dev)
        self.start_value = torch.zeros(num_envs, dtype=torch.float64, device=dev)
        self._reset(torch.ones(num_envs, dtype=torch.bool, device=dev))

    # ---- state ---------------------------------------------------------------------------------
    _STATE = ("key", "counter", "t", "steps", "cash", "shares", "ep_reward", "ep_cost", "ep_trades", "start_value")

    def state_dict(self) -> dict:
        return {name: getattr(self, name).clone() for name in self._STATE}

    def load_state_dict(self, state: dict) -> None:
        for name in self._STATE:
            if state[name].shape != getattr(self, name).shape:
                raise ValueError(f"environment state {name} has shape {tuple(state[name].shape)}, "
                                 f"expected {tuple(getattr(self, name).shape)}")
        for name in self._STATE:  # into the same tensors (a captured step reads them where they are)
            getattr(self, name).copy_(state[name])

    # ---- episodes ------------------------------------------------------------------------------
    def draw_starts(self, mask: torch.Tensor) -> torch.Tensor:
        """A start date per environment; the streams of the environments in `mask` advance, so each
        stream's draws depend on its own resets only."""
        u = uniform_u32(self.key, self.counter)
        self.counter.add_(mask.long())
        return self.first_start + (u * self.n_starts >> 32)

    # Every state tensor is updated in place, never rebound: a step compiled and captured as a CUDA graph
    # (ppo.collect's compiled step) reads and writes them at fixed addresses (tests/ppo/test_ppo_rollout.py).
    def _reset(self, mask: torch.Tensor) -> None:
        starts = self.draw_starts(mask)
        self.t.copy_(torch.where(mask, starts, self.t))
        self.steps.masked_fill_(mask, 0)
        self.cash.masked_fill_(mask, self.spec.initial_cash)
        self.shares.masked_fill_(mask[:, None], 0.0)
        self.start_value.masked_fill_(mask, self.spec.initial_cash)
        self.ep_reward.masked_fill_(mask, 0.0)
        self.ep_cost.masked_fill_(mask, 0.0)
        self.ep_trades.masked_fill_(mask, 0)

    def observe(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.t.clone(), self.portfolio()

    def portfolio(self) -> torch.Tensor:
        """[B, N+1] float32: each stock's and the cash's share of the portfolio's value at today's close."""
        price = self.market.close[self.t]
        held = self.shares * price
        value = self.cash + held.sum(-1)
        return (torch.cat([held, self.cash[:, None]], dim=1) / value[:, None]).float()

    def value(self) -> torch.Tensor:
        return self.cash + (self.shares * self.market.close[self.t]).sum(-1)

    # ---- one step ------------------------------------------------------------------------------
    def trade(self, action: torch.Tensor) -> dict:
        """Fill `action` [B, N] in [-1, 1] at today's close; returns what was traded (no time passes)."""
        price = self.market.close[self.t]
        action = action.to(torch.float64).clamp(-1.0, 1.0)
        value_before = self.cash + (self.shares * price).sum(-1)
        if self.spec.action == "trades":
            desired = torch.trunc(action * self.spec.h_max)
        else:
            w = (action + 1.0) / 2.0
            w = w / w.sum(-1, keepdim=True).clamp(min=1.0)
            desired = w * value_before[:, None] / price - self.shares
        sells = torch.minimum((-desired).clamp(min=0.0), self.shares)
        buys = desired.clamp(min=0.0)
        cash_after_sells = self.cash + (sells * price).sum(-1) * (1.0 - self.cost)
        buy_cost = (buys * price).sum(-1) * (1.0 + self.cost)
        short = buy_cost > cash_after_sells
        scale = torch.where(short, cash_after_sells / torch.where(short, buy_cost, 1.0), 1.0)
        buys = buys * scale[:, None]
        if self.spec.action == "trades":
            buys = torch.floor(buys)
        sold, bought = (sells * price).sum(-1), (buys * price).sum(-1)
        # max(.., 0): a scaled buy can overshoot the cash by a rounding error (~1e-10 of a dollar)
        self.cash.copy_((cash_after_sells - bought * (1.0 + self.cost)).clamp(min=0.0))
        self.shares.copy_(self.shares - sells + buys)
        trades = (sells > 0).sum(-1) + (buys > 0).sum(-1)
        cost = (sold + bought) * self.cost
        return {"value_before": value_before, "cost": cost, "trades": trades, "traded_value": sold + bought}

    def advance(self, action: torch.Tensor) -> tuple[dict, torch.Tensor]:
        """Trade at today's close, move to the next day; (what was traded, the value at the new close).
        No reward, no episode and no reset: a backtest's whole step (run_policy), and the start of `step`."""
        filled = self.trade(action)
        self.t.add_(1)
        return filled, self.value()

    def step(self, action: torch.Tensor):
        """Trade, move one day, reward; reset finished environments. Returns (obs, reward [B] float32,
        done [B] bool, info). info["episode"] holds the finished episodes' statistics (done mask)."""
        filled, value_after = self.advance(action)
        if self.spec.reward == "pnl":
            reward = (value_after - filled["value_before"]) * self.spec.reward_scale
        else:
            reward = torch.log(value_after / filled["value_before"])
        self.steps.add_(1)
        self.ep_reward.add_(reward)
        self.ep_cost.add_(filled["cost"])
        self.ep_trades.add_(filled["trades"])
        done = self.steps >= self.spec.episode_days
        info = {"value": value_after, **filled,
                "episode": {"done": done, "reward": self.ep_reward.clone(), "cost": self.ep_cost.clone(),
                            "trades": self.ep_trades.clone(), "final_value": value_after,
                            "return": value_after / self.start_value - 1.0}}
        self._reset(done)
        return self.observe(), reward.float(), done, info


def fixed_range_env(market: DeviceMarket, spec: EnvSpec, start: int, stop: int, num_envs: int = 1) -> VecPortfolioEnv:
    """Environments that all run one episode over decision dates start..stop-1 (validation, test)."""
    return VecPortfolioEnv(market, EnvSpec(**{**spec.__dict__, "episode_days": stop - start}), num_envs,
                           (start, stop), seed=0)
