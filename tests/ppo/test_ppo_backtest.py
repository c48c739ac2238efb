"""A backtest (evaluate.run_policy: every validation and the final test) runs the policy in two parts: the
market's part of the decision for many days in one batched pass, the portfolio's a day at a time. It must
take the decisions the whole model takes day by day, as the environment's own step loop would."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainers.ppo import evaluate
from trainers.ppo.env import DeviceMarket, EnvSpec, fixed_range_env
from trainers.ppo.evaluate import deterministic_actor, run_policy
from trainers.ppo.model import SquashedGaussianPolicy, TradingActorCritic
from trainers.ppo.ppo import make_norms

T, N, F, W = 200, 4, 3, 6


def market() -> DeviceMarket:
    rng = np.random.default_rng(0)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.02, (T, N)), 0))
    return DeviceMarket(close, rng.normal(0, 1, (T, N, F)).astype(np.float32), torch.device("cpu"))


def trading_policy(encoder: str, heads: str):
    """An untrained policy with its weights and normalisers moved far from their init, so that it trades."""
    torch.manual_seed(0)
    policy = SquashedGaussianPolicy(TradingActorCritic(N, F, W, hidden=8, encoder=encoder, heads=heads))
    norms = make_norms([F, N + 1], torch.device("cpu"))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5 * torch.randn_like(p))
        for norm in norms:
            norm.mean.normal_()
            norm.var.uniform_(0.5, 2.0)
    return policy.eval(), norms


def day_by_day(m: DeviceMarket, spec: EnvSpec, start: int, stop: int, policy, norms) -> dict:
    """The reference: the whole model (SquashedGaussianPolicy.deterministic) on each day's observation, stepped
    by the environment's training step, as the backtest ran before its two parts."""
    env = fixed_range_env(m, spec, start, stop)
    values, trades, actions = [env.value()], [], []
    with torch.no_grad():
        for _day in range(stop - start):
            t, portfolio = env.observe()
            action = policy.deterministic(norms[0](m.windows(t, spec.window)), norms[1](portfolio)).double()
            _obs, _reward, _done, info = env.step(action)
            actions.append(action)
            values.append(info["value"])
            trades.append(info["trades"])
    return {"values": torch.stack(values, 1).numpy(), "trades": torch.stack(trades, 1).numpy(),
            "actions": torch.cat(actions).numpy()}


@pytest.mark.parametrize("encoder,heads", [("clstm", "lstm"), ("clstm", "mlp"), ("mlp", "lstm")])
def test_a_backtest_takes_the_decisions_of_the_whole_model_day_by_day(encoder, heads, monkeypatch):
    m, spec = market(), EnvSpec(window=W, episode_days=10, cost_bps=10.0, h_max=50.0)
    policy, norms = trading_policy(encoder, heads)
    start, stop = 20, 70
    reference = day_by_day(m, spec, start, stop, policy, norms)
    actions = reference["actions"]  # a decision of its own each day, inside tanh's range: a test that compares
    assert reference["trades"].sum() >= stop - start and (np.abs(actions) < 0.99).mean() > 0.5
    assert len(np.unique(actions.round(4), axis=0)) == stop - start
    # 7 days a pass: the period's 50 days in 8 passes, the last one short
    monkeypatch.setattr(evaluate, "PREPARE_ELEMENTS", 7 * W * N * F)
    curve = run_policy(m, spec, start, stop, deterministic_actor(policy, norms))
    assert np.array_equal(curve["trades"][0], reference["trades"][0])
    np.testing.assert_allclose(curve["values"][0], reference["values"][0], rtol=1e-12)
    # and the two parts are the model's own forward: the actor's mean of a batch is forward's
    window, portfolio = m.windows(torch.arange(start, stop), W), torch.rand(stop - start, N + 1)
    with torch.no_grad():
        assert torch.equal(policy.deterministic(window, portfolio), torch.tanh(policy.net(window, portfolio)[0]))


@pytest.mark.parametrize("days_per_pass,passes", [(None, 1), (16, 3)])
def test_the_recurrent_work_runs_once_a_pass_not_once_a_day(days_per_pass, passes, monkeypatch):
    """On a GPU every operation is a launch: the cascade's and the actor's LSTMs run over the period's days
    together (one pass of the default size here), the critic not at all."""
    m, spec = market(), EnvSpec(window=W, episode_days=10)
    policy, norms = trading_policy("clstm", "lstm")
    if days_per_pass:
        monkeypatch.setattr(evaluate, "PREPARE_ELEMENTS", days_per_pass * W * N * F)
    calls = {"window_lstm": 0, "actor.lstm": 0, "critic.lstm": 0}
    for name in calls:
        module = policy.net.get_submodule(name)
        module.register_forward_hook(lambda *_a, name=name: calls.__setitem__(name, calls[name] + 1))
    curve = run_policy(m, spec, 20, 60, deterministic_actor(policy, norms))
    assert curve["values"].shape == (1, 41)
    assert calls == {"window_lstm": passes, "actor.lstm": passes, "critic.lstm": 0}


def test_a_pass_is_traded_before_the_next_is_prepared_and_holds_at_most_prepare_days():
    """Memory: a backtest holds one pass's output at a time (the next pass is prepared after the last day of
    this one is traded), and a pass is at most PREPARE_DAYS days whatever the period, so a long period or a wide
    model costs no more than a short one. (Before, every pass was kept and joined: 0.8 GB at 300 stocks.)"""
    m, spec = market(), EnvSpec(window=W, episode_days=10)
    calls = []

    def prepare(windows):
        calls.append(("prepare", len(windows)))
        return windows.new_empty(len(windows), 0)

    def act(_nothing, portfolio):
        calls.append(("act", 1))
        return torch.zeros(len(portfolio), N, dtype=torch.float64)

    days = 2 * evaluate.PREPARE_DAYS + 22
    run_policy(m, spec, 20, 20 + days, evaluate.Actor(prepare, act))
    expected = []
    for size in (evaluate.PREPARE_DAYS, evaluate.PREPARE_DAYS, 22):
        expected += [("prepare", size)] + [("act", 1)] * size
    assert calls == expected
