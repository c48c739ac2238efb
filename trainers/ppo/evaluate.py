"""Backtests on the validation and test periods, net of the same costs, and the metrics a quant reads.

The agent of each seed is the snapshot with the best validation score (--select-by: cumulative return,
the agent's own objective, or Sharpe; the test period is run once,
here, for the final report). Beside it on the same test dates: equal-weight buy-and-hold (bought on
the first day, never traded again), the equal-weight market (rebalanced to equal weights every day,
paying the costs of rebalancing), the same PPO with MLPs instead of the cascaded LSTM, and a random
policy. Metrics (daily, 252 trading days a year, no risk-free rate):

    cumulative return   V_T / V_0 - 1                 annualised return  (V_T / V_0)^(252/T) - 1
    annualised vol      std(r, ddof=1) * sqrt(252)    Sharpe             mean(r) / std(r, ddof=1) * sqrt(252)
    Sortino             mean(r) / sqrt(mean(min(r, 0)^2)) * sqrt(252)
    max drawdown        max_t (1 - V_t / max_{s<=t} V_s)                  Calmar  annualised return / max drawdown
    turnover            mean over days of traded value / portfolio value before trading (buys + sells)
    trades              number of (stock, day) buys or sells
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from trainers.ppo.build import AgentSet, chosen
from trainers.ppo.config import PpoConfig
from trainers.ppo.data import env_spec, load_checked_data
from trainers.ppo.env import DeviceMarket, EnvSpec, fixed_range_env
from trainers.ppo.features import TRADING_DAYS
from trainers.ppo.report import EQUITY_PNG, METRICS, markdown, plot_equity
from trainers.runtime.dist import DistContext, pick_device
from trainers.runtime.results import merge_results
from trainers.runtime.rundir import (
    exclusive,
    load_checkpoint_states,
    load_run_config,
    single_process_context,
)
from trainers.runtime.written import write_result


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 and math.isfinite(den) else None


def performance(values: np.ndarray, traded_value: np.ndarray | None = None, trades: np.ndarray | None = None,
                periods: int = TRADING_DAYS) -> dict:
    """Metrics of one equity curve V_0..V_T (and the traded value and trade count of each of the T
    decisions). Ratios with a zero denominator are None."""
    v = np.asarray(values, dtype=np.float64)
    r = v[1:] / v[:-1] - 1.0
    days = len(r)
    total = v[-1] / v[0]
    ann_return = total ** (periods / days) - 1.0
    std = r.std(ddof=1) if days > 1 else 0.0
    downside = math.sqrt(np.mean(np.minimum(r, 0.0) ** 2))
    drawdown = float(np.max(1.0 - v / np.maximum.accumulate(v)))
    sharpe = _ratio(r.mean(), std)
    sortino = _ratio(r.mean(), downside)
    out = {"cumulative_return": float(total - 1.0), "annualised_return": float(ann_return),
           "annualised_vol": float(std * math.sqrt(periods)),
           "sharpe": None if sharpe is None else float(sharpe * math.sqrt(periods)),
           "sortino": None if sortino is None else float(sortino * math.sqrt(periods)),
           "max_drawdown": drawdown, "calmar": _ratio(float(ann_return), drawdown), "days": days,
           "final_value": float(v[-1])}
    if traded_value is not None:
        out["turnover"] = float(np.mean(np.asarray(traded_value) / v[:-1]))
    if trades is not None:
        out["trades"] = int(np.sum(trades))
    return out


# ---- baselines that need no environment --------------------------------------------------------
def buy_and_hold(close: np.ndarray, cash: float, cost: float) -> dict:
    """Equal dollars in every stock on day 0 (paying the cost), held: V_t = shares . close_t."""
    n = close.shape[1]
    shares = cash / (n * (1.0 + cost)) / close[0]
    values = np.concatenate([[cash], (close[1:] * shares).sum(1)])
    traded = np.zeros(len(close) - 1)
    traded[0] = cash / (1.0 + cost)
    trades = np.zeros(len(close) - 1)
    trades[0] = n
    return {"values": values, "traded_value": traded, "trades": trades}


def equal_weight_market(close: np.ndarray, cash: float, cost: float) -> dict:
    """Rebalanced to equal weights at every close, paying cost on |trade| (the trade is sized on
    the value before its own cost: a second-order approximation, error ~ cost^2)."""
    n = close.shape[1]
    held = np.zeros(n)
    value = cash
    values, traded, trades = [cash], [], []
    for t in range(len(close) - 1):
        change = np.abs(value / n - held)
        value -= cost * change.sum()
        held = np.full(n, value / n) * close[t + 1] / close[t]
        value = held.sum()
        values.append(value)
        traded.append(change.sum())
        trades.append(int((change > 0).sum()))
    return {"values": np.array(values), "traded_value": np.array(traded), "trades": np.array(trades)}


# ---- policies through the environment ----------------------------------------------------------
# A pass of `Actor.prepare` takes at most PREPARE_DAYS days, fewer where their feature windows would exceed
# PREPARE_ELEMENTS (16 MB in float32); its output lives until the pass's days are traded, then the next pass
# runs. So a backtest holds one pass, whatever the period's length, the market's width or the model's (its
# intermediates, [days, window, hidden], are bounded by the day count); a 349-day test is 6 passes.
PREPARE_DAYS = 64
PREPARE_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Actor:
    """A backtest's policy in two parts. `prepare(windows [D, W, N, F]) -> [D, ...]`: what it decides from the
    market alone, for many days in one batched pass (the market does not depend on the agent's trades);
    `act(prepared [B, ...], portfolio [B, N+1]) -> action [B, N]`: the rest, a day at a time, since the
    portfolio is the day before's trades. On a GPU each operation is a kernel launch: the trained agent's
    recurrent work (the cascade, the actor's LSTM) runs in a few passes per period instead of once a day."""
    prepare: Callable
    act: Callable


@torch.no_grad()
def run_policy(market: DeviceMarket, spec: EnvSpec, start: int, stop: int, actor: Actor, num_envs: int = 1) -> dict:
    """Run `actor` over decisions start..stop-1 in `num_envs` parallel copies (every copy's decision k is
    made at date start+k, on the window ending there); equity curves [num_envs, days+1], traded value and
    trades [num_envs, days]. Kept on the device: one copy to the host at the end, no wait per simulated day."""
    env = fixed_range_env(market, spec, start, stop, num_envs)
    per_pass = max(1, min(PREPARE_DAYS, PREPARE_ELEMENTS // (spec.window * market.n_stocks * market.n_features)))
    values, traded, trades = [env.value()], [], []
    for days in torch.arange(start, stop, device=market.device).split(per_pass):
        for prepared in actor.prepare(market.windows(days, spec.window)).unbind():
            action = actor.act(prepared.expand(num_envs, *prepared.shape), env.portfolio())
            filled, value = env.advance(action)  # one episode that ends with the period: no reward, no reset
            values.append(value)
            traded.append(filled["traded_value"])
            trades.append(filled["trades"])
    return {name: torch.stack(days, 1).cpu().numpy()
            for name, days in (("values", values), ("traded_value", traded), ("trades", trades))}


def deterministic_actor(policy, norms) -> Actor:
    """The policy's deterministic action (SquashedGaussianPolicy.deterministic, in its two parts)."""
    policy.eval()
    net = policy.net
    market_norm, portfolio_norm = (torch.nn.Identity(), torch.nn.Identity()) if norms is None else norms

    def act(features, portfolio):
        return torch.tanh(net.actor_mean(features, portfolio_norm(portfolio))).double()
    return Actor(prepare=lambda windows: net.actor_features(market_norm(windows)), act=act)


def random_actor(n_stocks: int, seed: int, device: torch.device) -> Actor:
    """Uniform actions in [-1, 1], drawn from its own generator; it reads nothing of the market."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return Actor(prepare=lambda windows: windows.new_empty(len(windows), 0),
                 act=lambda _nothing, portfolio: torch.rand(len(portfolio), n_stocks, generator=gen, device=device,
                                                            dtype=torch.float64) * 2 - 1)


SELECT_BY = {"return": "cumulative_return", "sharpe": "sharpe"}


def validation_score(market: DeviceMarket, spec: EnvSpec, split: tuple[int, int], policy, norms, select_by: str) -> float:
    """The deterministic policy's cumulative return or Sharpe over `split` (Sharpe 0 when it never
    moves). Sharpe is blind to exposure (half in cash scores as all in), so `return` is the default."""
    curve = run_policy(market, spec, *split, deterministic_actor(policy, norms))
    return performance(curve["values"][0])[SELECT_BY[select_by]] or 0.0


def _row(curves: dict, i: int | None = None) -> dict:
    pick = (lambda a: a) if i is None else (lambda a: a[i])
    return performance(pick(curves["values"]), pick(curves["traded_value"]), pick(curves["trades"]))


def summarise(rows: list[dict]) -> dict:
    """mean, std (ddof=1 when > 1 row) and the values of each metric over seeds or runs."""
    out = {"n": len(rows)}
    for k in METRICS:
        vals = [r[k] for r in rows if r.get(k) is not None]
        if vals:
            out[k] = {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                      "values": vals}
    return out


def backtest(agents: list[dict], market: DeviceMarket, spec: EnvSpec, splits: dict, close: np.ndarray, random_runs: int,
             seed: int) -> dict:
    """Every agent on validation and test, the baselines on test. `agents`: dicts with encoder,
    seed, policy, norms, selected_update, val_score."""
    test = splits["test"]
    cost = spec.cost_bps / 1e4
    prices = close[test[0]:test[1] + 1]
    baselines = {"buy_and_hold_equal_weight": buy_and_hold(prices, spec.initial_cash, cost),
                 "equal_weight_market_rebalanced": equal_weight_market(prices, spec.initial_cash, cost)}
    rand = run_policy(market, spec, *test, random_actor(market.n_stocks, seed + 99_991, market.device), random_runs)
    rows, curves = {}, {}
    for a in agents:
        curve = run_policy(market, spec, *test, deterministic_actor(a["policy"], a["norms"]))
        val_curve = run_policy(market, spec, *splits["val"], deterministic_actor(a["policy"], a["norms"]))
        label = f"ppo_{a['encoder']}"
        rows.setdefault(label, []).append({**_row(curve, 0), "seed": a["seed"], "selected_update": a["selected_update"],
                                           "validation": performance(val_curve["values"][0])})
        curves[f"{label} seed {a['seed']}"] = curve["values"][0]
    table = {label: {"summary": summarise(r), "per_seed": r} for label, r in rows.items()}
    for name, b in baselines.items():
        table[name] = {"summary": summarise([_row(b)]), "per_seed": [_row(b)]}
        curves[name] = b["values"]
    random_rows = [_row(rand, i) for i in range(random_runs)]
    table["random_policy"] = {"summary": summarise(random_rows), "runs": random_runs}
    curves["random policy (mean)"] = rand["values"].mean(0)
    return {"table": table, "curves": curves}


# A difference smaller than the report prints (a return to 0.01 %, a Sharpe ratio to 0.01) is no difference: an agent
# whose actions are all but zero under --action weights IS the rebalanced market, and was said to beat it (-26.996 %
# against -27.001 %, both printed -27.00 %, its baseline's costs a second-order approximation of the environment's).
SHOWN = {"cumulative_return": 1e-4, "sharpe": 0.01}


def _side(agent: dict, base: dict, metric: str) -> int | None:
    """+1 the agent's mean is higher by at least what the report shows, -1 lower, 0 level; None: n/a on a side."""
    a, b = agent.get(metric, {}).get("mean"), base.get(metric, {}).get("mean")
    if a is None or b is None:
        return None
    return 0 if abs(a - b) < SHOWN[metric] else (1 if a > b else -1)


def _compare(agent: dict, base: dict) -> tuple[list[int], str]:
    a_ret, b_ret = agent["cumulative_return"]["mean"], base["cumulative_return"]["mean"]
    a_sh, b_sh = agent.get("sharpe", {}).get("mean"), base.get("sharpe", {}).get("mean")
    text = (f"cumulative return {a_ret:+.2%} vs {b_ret:+.2%}, Sharpe {'n/a' if a_sh is None else f'{a_sh:.2f}'} "
            f"vs {'n/a' if b_sh is None else f'{b_sh:.2f}'}")
    sides = [side for m in SHOWN if (side := _side(agent, base, m)) is not None]  # (Sharpe n/a: all cash, flat)
    return sides, text


def verdict(table: dict, main: str) -> str:
    """Plain sentences: does the agent beat equal-weight buy-and-hold, and the equal-weight market,
    on the test period net of costs? (With --action weights the zero action IS the equal-weight
    market, so an agent that learned nothing matches that row.)"""
    if main not in table:
        return "No trained agent to compare."
    out = []
    for name, label in (("buy_and_hold_equal_weight", "equal-weight buy-and-hold"),
                        ("equal_weight_market_rebalanced", "the equal-weight market (rebalanced daily)")):
        sides, text = _compare(table[main]["summary"], table[name]["summary"])
        if 1 in sides and -1 not in sides:
            out.append(f"The agent ({main}) beats {label} on the test period net of costs: {text}.")
        elif -1 in sides and 1 not in sides:
            out.append(f"The agent ({main}) does NOT beat {label} on the test period: {text}.")
        elif 1 in sides:
            out.append(f"Mixed: the agent ({main}) beats {label} on one of return and Sharpe only: {text}.")
        else:
            out.append(f"The agent ({main}) matches {label} on the test period (no difference at the precision "
                       f"shown: no skill beyond it): {text}.")
    return " ".join(out)


def evaluate_agents(agents, cfg: PpoConfig, data, market, spec, run_dir: Path, ctx: DistContext,
           checkpoint_step: int | None) -> dict | None:
    if not ctx.is_main:
        return None
    rows = []
    for a in agents.agents:
        policy, norms, update, val = chosen(a)
        if a.updates_done == 0:
            continue  # never trained (the run stopped before this agent's turn)
        rows.append({"encoder": a.encoder, "seed": a.seed, "policy": policy, "norms": norms, "selected_update": update,
                     "val_score": val})
    result = backtest(rows, market, spec, data.splits, data.close, cfg.random_runs, cfg.seed)
    test = data.splits["test"]
    main = f"ppo_{cfg.encoder}"
    evaluation = {"checkpoint_step": checkpoint_step, "test_dates": [data.dates[test[0]], data.dates[test[1]]],
                  "test_days": test[1] - test[0], "cost_bps": cfg.cost_bps, "action": cfg.action,
                  "selection": f"per seed, the update with the best validation {cfg.select_by} (deterministic policy)",
                  "table": result["table"], "verdict": verdict(result["table"], main),
                  "untrained_agents": [f"{a.encoder}/seed{a.seed}" for a in agents.agents if a.updates_done == 0]}
    write_result(run_dir / "results.md", lambda f: f.write(markdown(evaluation)), mode="w")
    dates = data.dates[test[0]:test[1] + 1]
    png = run_dir / EQUITY_PNG
    write_result(png, lambda f: plot_equity(result["curves"], dates, f, f"test period, net of {cfg.cost_bps:g} bp"))
    evaluation["equity_curve_png"] = EQUITY_PNG
    print(evaluation["verdict"])
    return evaluation


def evaluate_run(run_dir: str, checkpoint: str = "latest", device: str = "auto") -> dict:
    """Rebuild the run's data and agents from a checkpoint and write the report again."""
    run_path = Path(run_dir)
    cfg = load_run_config(run_path, PpoConfig)
    dev = str(pick_device(0, device))
    with exclusive(run_path):  # not while training (or another command) writes into the folder
        step, states = load_checkpoint_states(run_path, checkpoint, dev)
        ctx = single_process_context(dev)
        data, _ = load_checked_data(cfg, run_path, "its evaluation needs the data it trained on")
        market = DeviceMarket(data.close, data.features, ctx.device)
        agents = AgentSet(cfg, data.n_stocks, ctx.device)
        agents.load_state_dict(states["agents"])
        evaluation = evaluate_agents(agents, cfg, data, market, env_spec(cfg), run_path, ctx, step)
        merge_results(run_path, {"evaluation": evaluation})
        return evaluation
