"""The pieces PPO is built from, against hand-computed values: the squashed Gaussian's
log-probability, GAE, the running normaliser, the model's shapes, and the report's metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainers.ppo.evaluate import buy_and_hold, equal_weight_market, performance, summarise, verdict
from trainers.ppo.model import (
    CategoricalPolicy,
    RunningNorm,
    SquashedGaussianPolicy,
    TradingActorCritic,
    squash_correction,
)
from trainers.ppo.ppo import NormStats, Rollout, advantages, anneal_lr
from trainers.runtime.rundir import single_process_context


def test_squashed_log_prob_is_the_change_of_variables_of_the_gaussian():
    torch.manual_seed(0)
    net = TradingActorCritic(3, 2, 4, hidden=8, encoder="clstm", heads="lstm", init_log_std=-0.3)
    policy = SquashedGaussianPolicy(net)
    market, portfolio = torch.randn(5, 4, 3, 2), torch.rand(5, 4)
    u, a, log_prob, value = policy.act(market, portfolio, generator=torch.Generator().manual_seed(1))
    mean = net(market, portfolio)[0]
    base = torch.distributions.Normal(mean, torch.exp(net.log_std))
    squashed = torch.distributions.TransformedDistribution(base, [torch.distributions.TanhTransform()])
    expected = squashed.log_prob(a.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1)
    assert torch.allclose(log_prob, expected, atol=1e-3)
    assert torch.equal(a, torch.tanh(u)) and value.shape == (5,)
    again, entropy, value2 = policy(market, portfolio, u)  # the training path gives the same numbers
    assert torch.allclose(again, log_prob, atol=1e-5) and torch.allclose(value2, value)
    assert torch.allclose(entropy, (net.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum().expand(5))
    # the stable correction equals the naive formula where tanh does not saturate, and stays finite where it does
    x = torch.linspace(-3, 3, 13)
    assert torch.allclose(squash_correction(x[:, None]), torch.log(1 - torch.tanh(x) ** 2), atol=1e-5)
    assert torch.isfinite(squash_correction(torch.tensor([[40.0]]))).all()


@pytest.mark.parametrize("encoder,heads", [("clstm", "lstm"), ("clstm", "mlp"), ("mlp", "lstm")])
def test_model_shapes_and_the_cascade_reads_the_window_in_order(encoder, heads):
    torch.manual_seed(0)
    net = TradingActorCritic(4, 6, 10, hidden=16, encoder=encoder, heads=heads)
    market, portfolio = torch.randn(3, 10, 4, 6), torch.rand(3, 5)
    mean, value = net(market, portfolio)
    assert mean.shape == (3, 4) and value.shape == (3,)
    flipped = net(market.flip(1), portfolio)[1]
    assert not torch.allclose(flipped, value)  # the order of days matters
    # orthogonal init as CleanRL: the actor's last layer small, so the first actions are near 0
    assert mean.abs().max() < 0.5


def test_categorical_policy_log_prob_and_entropy():
    torch.manual_seed(0)
    policy = CategoricalPolicy(4, 3)
    obs = torch.randn(6, 4)
    action, _, log_prob, _ = policy.act(obs, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(policy.actor(obs), -1)
    assert torch.allclose(log_prob, probs.gather(1, action[:, None]).squeeze(1).log(), atol=1e-6)
    _, entropy, _ = policy(obs, action)
    assert torch.allclose(entropy, -(probs * probs.log()).sum(-1), atol=1e-6)


def test_gae_against_a_hand_computed_rollout():
    buf = Rollout(3, (torch.zeros(1, 1),), (), torch.float32, torch.device("cpu"))
    buf.rewards[:, 0] = torch.tensor([1.0, 2.0, 3.0])
    buf.values[:, 0] = torch.tensor([0.5, 1.0, 1.5])
    buf.dones[:, 0] = torch.tensor([0.0, 0.0, 1.0])  # obs 2 starts a new episode: nothing flows from 2 into 1
    gamma, lam = 0.9, 0.8
    adv, ret = advantages(buf, torch.tensor([2.0]), torch.tensor([False]), gamma, lam)
    d2 = 3.0 + gamma * 2.0 - 1.5
    d1 = 2.0 - 1.0  # episode ends after step 1
    d0 = 1.0 + gamma * 1.0 - 0.5
    a2, a1 = d2, d1
    a0 = d0 + gamma * lam * a1
    assert torch.allclose(adv[:, 0], torch.tensor([a0, a1, a2])) and torch.allclose(ret, adv + buf.values)


def test_running_norm_merges_batches_like_one_pass():
    rng = np.random.default_rng(0)
    norms = torch.nn.ModuleList([RunningNorm(3)])
    chunks = [rng.normal(2.0, 3.0, (n, 3)) for n in (50, 7, 400)]
    for c in chunks:
        stats = NormStats(norms, torch.device("cpu"))
        stats.add((torch.from_numpy(c).float(),))
        stats.merge_into(norms, single_process_context())
    everything = np.concatenate(chunks)
    assert np.allclose(norms[0].mean.numpy(), everything.mean(0), atol=1e-4)
    assert np.allclose(norms[0].var.numpy(), everything.var(0), rtol=1e-3)
    out = norms[0](torch.from_numpy(everything).float())
    assert abs(out.mean().item()) < 1e-3 and abs(out.std().item() - 1) < 1e-2


def test_lr_annealing_is_linear_from_the_initial_rate():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    assert [anneal_lr(opt, 0.3, u, 4) for u in range(4)] == pytest.approx([0.3, 0.225, 0.15, 0.075])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.075)


def test_performance_metrics_against_hand_computed_values():
    v = np.array([100.0, 110.0, 99.0, 108.9])  # returns +10 %, -10 %, +10 %
    m = performance(v, traded_value=np.array([50.0, 0.0, 11.0]), trades=np.array([2, 0, 1]), periods=252)
    r = np.array([0.1, -0.1, 0.1])
    assert m["cumulative_return"] == pytest.approx(0.089)
    assert m["annualised_return"] == pytest.approx(1.089 ** (252 / 3) - 1)
    std = math.sqrt(((r - r.mean()) ** 2).sum() / 2)  # ddof=1
    assert m["annualised_vol"] == pytest.approx(std * math.sqrt(252))
    assert m["sharpe"] == pytest.approx(r.mean() / std * math.sqrt(252))
    assert m["sortino"] == pytest.approx(r.mean() / math.sqrt(0.01 / 3) * math.sqrt(252))
    assert m["max_drawdown"] == pytest.approx(0.1)  # 110 -> 99
    assert m["calmar"] == pytest.approx(m["annualised_return"] / 0.1)
    assert m["turnover"] == pytest.approx((50 / 100 + 0 + 11 / 99) / 3)
    assert m["trades"] == 3 and m["days"] == 3
    flat = performance(np.array([5.0, 5.0, 5.0]))
    assert flat["sharpe"] is None and flat["sortino"] is None and flat["max_drawdown"] == 0 and flat["calmar"] is None


def test_baselines_against_hand_computed_values():
    close = np.array([[10.0, 20.0], [11.0, 20.0], [12.0, 22.0]])
    bh = buy_and_hold(close, 1000.0, 0.01)
    shares = np.array([500 / 1.01 / 10, 500 / 1.01 / 20])
    assert bh["values"] == pytest.approx([1000.0, shares @ close[1], shares @ close[2]])
    assert bh["traded_value"][0] == pytest.approx(1000 / 1.01) and bh["trades"].sum() == 2
    ew = equal_weight_market(close, 1000.0, 0.01)
    v1 = (1000 - 10.0) / 2 * (1.1 + 1.0)  # pay 1 % of 1000 to buy, then the day's returns
    held = np.array([(1000 - 10.0) / 2 * 1.1, (1000 - 10.0) / 2])
    trade = np.abs(v1 / 2 - held).sum()
    v2 = (v1 - 0.01 * trade) / 2 * (12 / 11 + 22 / 20)
    assert ew["values"] == pytest.approx([1000.0, v1, v2])


def test_summary_and_the_plain_verdict():
    rows = [{"cumulative_return": 0.1, "sharpe": 1.0}, {"cumulative_return": 0.3, "sharpe": None}]
    s = summarise(rows)
    assert s["n"] == 2 and s["cumulative_return"]["mean"] == pytest.approx(0.2)
    assert s["cumulative_return"]["std"] == pytest.approx(math.sqrt(0.02)) and s["sharpe"]["values"] == [1.0]
    table = {"ppo_clstm": {"summary": summarise([{"cumulative_return": 0.01, "sharpe": 0.2}])},
             "buy_and_hold_equal_weight": {"summary": summarise([{"cumulative_return": 0.05, "sharpe": 0.9}])},
             "equal_weight_market_rebalanced": {"summary": summarise([{"cumulative_return": 0.0, "sharpe": 0.1}])}}
    text = verdict(table, "ppo_clstm")
    assert "does NOT beat equal-weight buy-and-hold on the test period: cumulative return +1.00% vs +5.00%" in text
    assert "beats the equal-weight market (rebalanced daily) on the test period net of costs" in text
    # level at the precision shown (an all-but-zero --action weights agent IS the rebalanced market): no skill, not
    # "beats" over noise in the last digits; a Sharpe ratio of n/a (all cash) leaves the return to judge
    table["ppo_clstm"] = {"summary": summarise([{"cumulative_return": -0.269962, "sharpe": -3.2035498}])}
    table["equal_weight_market_rebalanced"] = {"summary": summarise([{"cumulative_return": -0.270013,
                                                                      "sharpe": -3.2035549}])}
    text = verdict(table, "ppo_clstm")
    assert ("matches the equal-weight market (rebalanced daily) on the test period (no difference at the precision "
            "shown: no skill beyond it): cumulative return -27.00% vs -27.00%, Sharpe -3.20 vs -3.20") in text
    table["ppo_clstm"] = {"summary": summarise([{"cumulative_return": 0.0, "sharpe": None}])}
    text = verdict(table, "ppo_clstm")
    assert "does NOT beat equal-weight buy-and-hold" in text and "Sharpe n/a vs 0.90" in text
    assert "beats the equal-weight market (rebalanced daily) on the test period net of costs" in text and "Mixed" \
        not in text


def _update_once(grad_accum: int, target_kl: float | None = None, epochs: int = 2):
    from trainers.ppo.ppo import Learner, PPOSettings, update
    from trainers.runtime.precision import Precision, make_grad_scaler

    torch.manual_seed(0)
    policy = SquashedGaussianPolicy(TradingActorCritic(3, 2, 4, hidden=8, encoder="mlp"))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    buf = Rollout(6, (torch.zeros(5, 4, 3, 2), torch.zeros(5, 4)), (3,), torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    buf.obs[0].normal_(generator=g)
    buf.obs[1].uniform_(generator=g)
    buf.actions.normal_(generator=g)
    buf.log_probs.normal_(generator=g)
    buf.values.normal_(generator=g)
    adv, ret = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    s = PPOSettings(update_epochs=epochs, minibatch_size=10, grad_accum=grad_accum, target_kl=target_kl)
    fp32, cpu = Precision("fp32", None), torch.device("cpu")
    learner = Learner(policy, policy, None, lambda o: o, opt, make_grad_scaler(cpu, fp32), fp32, cpu)
    stats = update(learner, buf, adv, ret, s, torch.Generator().manual_seed(3), single_process_context())
    return torch.cat([p.detach().flatten() for p in policy.parameters()]), stats


def test_grad_accum_gives_the_same_update_and_target_kl_stops_early():
    whole, _ = _update_once(1)
    split, _ = _update_once(3)  # minibatches of 10 in micro-batches of 4, 3, 3
    assert torch.allclose(whole, split, atol=1e-6)
    _, full = _update_once(1, epochs=5)
    _, stopped = _update_once(1, target_kl=1e-9, epochs=5)
    assert full["epochs"] == 5 and stopped["epochs"] == 1


def test_a_file_keeps_its_own_dates(tmp_path):
    """--years (25 by default) counts back from the file's last date: from today it cut a file of
    2000-2002 to nothing (every ticker then failed validation)."""
    from trainers.market.synthetic import synthetic_market
    from trainers.ppo.config import PpoConfig
    from trainers.ppo.data import pin_dates

    synthetic_market(6, 700, seed=2).to_csv(tmp_path / "old.csv", index=False)  # 2000-01-03 .. 2002-09-06
    cfg = pin_dates(PpoConfig(source=f"file:{tmp_path / 'old.csv'}"), None)
    assert (cfg.start, cfg.end) == ("1977-09-07", "2002-09-07")
    cfg = pin_dates(PpoConfig(source=f"file:{tmp_path / 'old.csv'}"), {"start": "2001-01-02", "end": "2002-01-02"})
    assert (cfg.start, cfg.end) == ("2001-01-02", "2002-01-02")  # a resume reads the dates it pinned


def test_ppo_computes_its_policy_in_fp32_unless_asked_otherwise():
    """bf16 rounds the heads' outputs differently in the rollout's batch and the update's minibatch: the
    probability ratio would be noisy from its first step. auto is fp32 everywhere, rehearsed GPU or not."""
    import torch

    from trainers.ppo.train import policy_precision

    cpu = torch.device("cpu")
    assert policy_precision(cpu, "auto", rehearse=True).autocast_dtype is None
    assert policy_precision(cpu, "auto").name == "fp32"
    assert policy_precision(cpu, "bf16").autocast_dtype == torch.bfloat16  # asked for: still honoured


def _file_with_bad_closes(tmp_path, per_ticker: dict[str, list[int]]):
    """A synthetic market as a user's file, with NaN, <= 0 and infinite closes on the given rows of each ticker."""
    from trainers.market.synthetic import synthetic_market

    frame = synthetic_market(5, 600, seed=0)
    bad = [np.nan, -1.0, np.inf, 0.0]
    for ticker, days in per_ticker.items():
        rows = frame.index[frame["ticker"] == ticker][days]
        frame.loc[rows, "close"] = [bad[i % len(bad)] for i in range(len(rows))]
    path = tmp_path / "prices.csv"
    frame.to_csv(path, index=False)
    return path


def test_scattered_bad_closes_are_dropped_counted_and_filled_not_the_whole_file_refused(tmp_path):
    """A regression (issue 34): a file with a few bad closes (NaN, <= 0, infinite) on every ticker was refused as
    '0 stock(s) with a bar on every date ... more tickers, or a shorter range'. Bad rows are dropped and counted
    per ticker; a gap of up to MAX_FILLED_GAP dates takes the last close, and the stock trades."""
    from trainers.ppo.config import PpoConfig
    from trainers.ppo.data import load_trading_data
    from trainers.ppo.features import MAX_FILLED_GAP

    path = _file_with_bad_closes(tmp_path, {f"SYN00{i}": [100 + 37 * i, 300 + 11 * i] for i in range(5)}
                                 | {"SYN004": [100, 101, 102, 300]})
    data, info = load_trading_data(PpoConfig(source=f"file:{path}", num_stocks=5, window=8), log=lambda _m: None)
    assert data.n_stocks == 5 and np.isfinite(data.close).all() and (data.close > 0).all()
    assert info["validation"]["bad_prices"] == 12
    assert info["rows_dropped_by_stock"]["SYN004"] == {"bad_prices": 4}
    assert info["bars_filled"]["SYN004"] == 4 and sum(info["bars_filled"].values()) == 12
    assert MAX_FILLED_GAP >= 3


def test_when_too_few_stocks_are_left_the_refusal_names_the_bad_rows(tmp_path):
    from trainers.errors import UsageError
    from trainers.ppo.config import PpoConfig
    from trainers.ppo.data import load_trading_data
    from trainers.ppo.features import MAX_FILLED_GAP

    long_gap = lambda i: list(range(200 + 50 * i, 200 + 50 * i + MAX_FILLED_GAP + 1))  # noqa: E731 (one too many)
    path = _file_with_bad_closes(tmp_path, {f"SYN00{i}": long_gap(i) for i in range(5)})  # on other dates each
    with pytest.raises(UsageError) as err:
        load_trading_data(PpoConfig(source=f"file:{path}", num_stocks=5, window=8), log=lambda _m: None)
    message = str(err.value)
    assert "0 stock(s)" in message and "lost bars to validation" in message and "SYN000 6" in message
    assert "shorter --start/--end range" not in message  # not the wrong remedy
