"""Every metric against a value worked out by hand (the arithmetic is in the comments)."""

import math

import numpy as np
import pytest

from trainers.lstm.metrics import (
    _ranks,
    auc_standard_error,
    balanced_accuracy,
    brier,
    calibration_table,
    classification_metrics,
    log_loss,
    long_flat_strategy,
    roc_auc,
    skill_verdict,
)

Y = np.array([1, 0, 1, 1, 0], dtype=float)
P = np.array([0.9, 0.2, 0.6, 0.4, 0.4])


def test_ranks_share_ties():
    assert _ranks(np.array([3.0, 1.0, 2.0, 2.0])).tolist() == [4.0, 1.0, 2.5, 2.5]


def test_roc_auc_by_counting_pairs():
    # up scores {0.9, 0.6, 0.4} vs down {0.2, 0.4}: 0.9 wins 2, 0.6 wins 2, 0.4 wins 1 and ties 1 (half): 5.5 / 6
    assert roc_auc(Y, P) == pytest.approx(5.5 / 6)
    assert roc_auc(np.array([1.0, 1.0]), np.array([0.3, 0.7])) is None  # one class: undefined
    assert roc_auc(Y, 1 - P) == pytest.approx(0.5 / 6)


def test_auc_standard_error_hanley_mcneil():
    # A = 11/12, n+ = 3, n- = 2: Q1 = A/(2-A) = 11/13, Q2 = 2A^2/(1+A) = 121/138,
    # var = (A(1-A) + 2(Q1 - A^2) + 1(Q2 - A^2)) / 6 = (0.0763889 + 0.0117521 + 0.0365338) / 6 = 0.0207791
    assert auc_standard_error(11 / 12, 3, 2) == pytest.approx(math.sqrt(0.0207791), rel=1e-5)


def test_log_loss_brier_and_accuracies():
    # -(ln .9 + ln .8 + ln .6 + ln .4 + ln .6) / 5 = (0.1053605 + 0.2231436 + 0.5108256 + 0.9162907 + 0.5108256) / 5
    assert log_loss(Y, P) == pytest.approx(2.2664460 / 5, rel=1e-6)
    assert brier(Y, P) == pytest.approx((0.01 + 0.04 + 0.16 + 0.36 + 0.16) / 5)
    # predicted up: [1, 0, 1, 0, 0]; up recall 2/3, down recall 2/2
    assert balanced_accuracy(Y, (P > 0.5).astype(float)) == pytest.approx((2 / 3 + 1) / 2)
    assert log_loss(np.array([1.0]), np.array([0.0])) == pytest.approx(-math.log(1e-7))  # clipped, finite


def test_calibration_table_in_equal_count_bins():
    # sorted by p: 0.2 (down), 0.4 (up), 0.4 (down) | 0.6 (up), 0.9 (up)
    rows = calibration_table(Y, P, 2)
    assert [r["count"] for r in rows] == [3, 2]
    assert rows[0]["mean_predicted"] == pytest.approx(1.0 / 3) and rows[0]["observed_up_rate"] == pytest.approx(1 / 3)
    assert rows[1]["mean_predicted"] == pytest.approx(0.75) and rows[1]["observed_up_rate"] == 1.0
    assert (rows[0]["p_low"], rows[0]["p_high"], rows[1]["p_low"], rows[1]["p_high"]) == (0.2, 0.4, 0.6, 0.9)


def test_classification_metrics_beside_the_base_rate_predictor():
    m = classification_metrics(Y, P, train_up_rate=0.5, bins=2)
    assert m["rows"] == 5 and m["up_rate"] == pytest.approx(0.6)
    assert m["model"]["accuracy"] == pytest.approx(0.8)
    assert m["baselines"]["majority_class_rate"] == pytest.approx(0.6)
    assert m["baselines"]["train_majority_accuracy"] == pytest.approx(0.6)  # train up-rate 0.5: "up"
    assert m["baselines"]["base_rate"]["log_loss"] == pytest.approx(math.log(2))  # p = 0.5 everywhere
    assert m["baselines"]["base_rate"]["brier"] == pytest.approx(0.25)
    assert m["model"]["log_loss"] < math.log(2)
    # AUC 0.917 +- 1.96 x 0.144 = 0.634 above 0.5 and log loss below the base: skill (on 5 rows, a toy)
    assert m["skill"]["has_skill"] and m["skill"]["verdict"].startswith("skill:")


def test_no_skill_is_said_plainly():
    verdict = skill_verdict({"log_loss": 0.6935, "roc_auc": 0.52, "roc_auc_se": 0.02},
                            {"base_rate": {"log_loss": 0.6931}})
    assert not verdict["has_skill"]
    assert verdict["verdict"] == ("no skill: log loss 0.6935 is not below the base rate's 0.6931; "
                                  "AUC 0.520 +- 0.039 includes 0.5")
    ok_loss_but_weak_auc = skill_verdict({"log_loss": 0.69, "roc_auc": 0.53, "roc_auc_se": 0.02},
                                         {"base_rate": {"log_loss": 0.6931}})
    assert not ok_loss_but_weak_auc["has_skill"] and "includes 0.5" in ok_loss_but_weak_auc["verdict"]


def test_long_flat_strategy_net_of_costs_beside_buy_and_hold():
    p = np.array([0.6, 0.4, 0.7, 0.8])
    r = np.array([0.01, -0.02, 0.03, -0.01])
    out = long_flat_strategy(p, r, cost_bps=10.0, bars_per_year=252)
    s, h = out["long_flat"], out["buy_and_hold"]
    # positions 1, 0, 1, 1: gross 0.01 + 0.03 - 0.01 = 0.03; three changes (entry, exit, entry) at ln(1 - 0.001)
    assert s["total_log_return"] == pytest.approx(0.03 + 3 * math.log(0.999))
    assert s["exposure"] == 0.75 and s["position_changes"] == 3
    assert s["costs_log"] == pytest.approx(-3 * math.log(0.999))
    # buy-and-hold: 0.01 - 0.02 + 0.03 - 0.01 = 0.01, one entry
    assert h["total_log_return"] == pytest.approx(0.01 + math.log(0.999)) and h["position_changes"] == 1
    assert h["total_return"] == pytest.approx(math.expm1(0.01 + math.log(0.999)))
    assert out["beats_buy_and_hold"] is True
    net = np.array([0.01, 0.0, 0.03, -0.01]) + np.log(0.999) * np.array([1, 1, 1, 0])
    assert s["sharpe_annualised"] == pytest.approx(net.mean() / net.std(ddof=1) * math.sqrt(252))


def test_persistence_and_linear_baselines_on_the_same_rows():
    past = np.array([0.02, 0.01, -0.01, 0.03, -0.02])  # up before: 1, 1, 0, 1, 0 vs y 1, 0, 1, 1, 0: 3 of 5
    linear = np.array([0.7, 0.3, 0.6, 0.6, 0.5])
    m = classification_metrics(Y, P, 0.5, 2, past, linear)
    assert m["baselines"]["persistence"]["accuracy"] == pytest.approx(0.6)
    # past as a score: up {0.02, -0.01, 0.03} vs down {0.01, -0.02}: 0.02 wins 2, -0.01 wins 1, 0.03 wins 2: 5/6
    assert m["baselines"]["persistence"]["roc_auc"] == pytest.approx(5 / 6)
    lr = m["baselines"]["logistic_regression"]
    assert lr["accuracy"] == pytest.approx(1.0) and lr["roc_auc"] == pytest.approx(1.0)  # > 0.5 on all 3 ups
    assert lr["log_loss"] == pytest.approx(-(math.log(.7) + math.log(.7) + math.log(.6) + math.log(.6)
                                             + math.log(.5)) / 5)


def test_an_auc_clearly_below_one_half_is_called_worse_than_a_coin():
    verdict = skill_verdict({"log_loss": 0.70, "roc_auc": 0.40, "roc_auc_se": 0.02}, {"base_rate": {"log_loss": 0.69}})
    assert "AUC 0.400 +- 0.039 is below 0.5 (worse than a coin)" in verdict["verdict"]


def test_the_linear_baseline_is_fitted_to_the_optimum_of_the_models_own_loss():
    """Newton's method on the host (trainers.lstm.evaluate.newton_logistic) against torch's L-BFGS on
    direction_loss + l2 |w|^2 (what the fit replaced): the same weights, an objective no higher, a
    gradient of zero; a split of one class only ends with finite weights."""
    import torch

    from trainers.lstm.evaluate import logistic_objective, newton_logistic
    from trainers.lstm.model import direction_loss

    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 6))
    y = (rng.random(800) < 1 / (1 + np.exp(-x @ rng.normal(size=6)))).astype(float)
    pos_weight, l2 = float((1 - y).sum() / y.sum()), 1e-3
    theta = newton_logistic(x, y, pos_weight, l2, 50)
    value, gradient, _ = logistic_objective(theta, x, y, pos_weight, l2)
    assert np.abs(gradient).max() < 1e-9

    linear = torch.nn.Linear(6, 1).double()
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    xt, yt = torch.tensor(x), torch.tensor(y)
    optimizer = torch.optim.LBFGS(linear.parameters(), lr=1.0, max_iter=500, tolerance_grad=1e-12,
                                  tolerance_change=1e-15, line_search_fn="strong_wolfe")

    def objective():
        optimizer.zero_grad()
        loss = direction_loss(linear(xt).squeeze(-1), yt, torch.tensor(pos_weight)) + l2 * linear.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(objective)
    lbfgs = np.r_[linear.weight.detach().numpy()[0], linear.bias.detach().numpy()]
    assert value <= logistic_objective(lbfgs, x, y, pos_weight, l2)[0] + 1e-12
    assert np.abs(theta - lbfgs).max() < 1e-5

    one_class = newton_logistic(x, np.ones(800), 1.0, l2, 50)
    assert np.isfinite(one_class).all() and (x @ one_class[:-1] + one_class[-1]).min() > 0  # every row says up
