"""What the agent is shown at a decision, checked where the agent is given it: the feature window of
the evaluation loop (run_policy) and of the training rollouts (a real `train`), and the indicators
one day ahead. test_ppo_env.py checks that rewards follow the rules and that indicators() does not
move when the future is rewritten, but it rewrites the future from a day whose price it leaves
unchanged (a factor of exactly 1), so an indicator reading t+1 passed it; and nothing checked the
window itself, so the agent seeing tomorrow's row passed every test (tests/leaks/ makes both)."""

from __future__ import annotations

import numpy as np
import torch

from trainers.market.panel import to_panel
from trainers.market.synthetic import synthetic_market
from trainers.ppo.env import DeviceMarket, EnvSpec, VecPortfolioEnv
from trainers.ppo.evaluate import Actor, run_policy
from trainers.ppo.features import indicators

T, N, F, W = 60, 3, 2, 5


def labelled_market() -> tuple[np.ndarray, np.ndarray]:
    """Prices, and features whose value says which (date, stock, feature) they are: a row read from
    the wrong date is seen at once. Float32 holds these integers exactly."""
    rng = np.random.default_rng(0)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, (T, N)), 0))
    t, n, f = np.meshgrid(np.arange(T), np.arange(N), np.arange(F), indexing="ij")
    return close, (t * 100 + n * 10 + f).astype(np.float32)


def test_the_window_of_a_decision_ends_at_its_date_in_the_evaluation_loop():
    close, feats = labelled_market()
    market = DeviceMarket(close, feats, torch.device("cpu"))
    spec = EnvSpec(window=W, episode_days=10, action="weights", cost_bps=0.0)
    seen = []

    def act(window, portfolio):  # the window itself is what `prepare` passes on for each day
        seen.append(window.clone())
        return torch.ones(len(portfolio), N, dtype=torch.float64)  # all in, equal weights

    start, stop = 20, 30
    curve = run_policy(market, spec, start, stop, Actor(prepare=lambda windows: windows, act=act))
    assert len(seen) == stop - start
    for k, window in enumerate(seen):
        t = start + k  # the k-th decision is made at date t's close
        assert window.shape == (1, W, N, F)
        assert torch.equal(window[0], torch.from_numpy(feats[t - W + 1: t + 1])), f"decision at {t}"
        assert window[0, -1, 0, 0].item() == t * 100  # the last row is the decision date's, never t + 1
    # and the portfolio is valued at the next close: the first day's equity moves with close[start + 1]
    held = (1 / 3) * curve["values"][0, 0] / close[start]  # shares bought at close[start] (no cost)
    assert np.isclose(curve["values"][0, 1], held @ close[start + 1], rtol=1e-12)


def test_training_rollouts_show_each_environment_the_window_ending_at_its_own_date(tmp_path, monkeypatch):
    """A real (tiny) `trainers ppo train`: every environment step of the training rollouts is taken on the
    window that ends at that environment's current date (its validation runs are run_policy's: the test above)."""
    from trainers.cli import main

    last = {}
    checked = []
    windows, step = DeviceMarket.windows, VecPortfolioEnv.step

    def recording_windows(self, t, window):
        last["market"], last["t"] = self, t.clone()
        return windows(self, t, window)

    def checking_step(self, action):
        # the policy's inputs were built just before this step, from the observation of this state
        checked.append(last.get("market") is self.market and torch.equal(last["t"], self.t))
        return step(self, action)

    monkeypatch.setattr(DeviceMarket, "windows", recording_windows)
    monkeypatch.setattr(VecPortfolioEnv, "step", checking_step)
    args = ["ppo", "train", "--synthetic-tickers", "4", "--num-stocks", "3", "--synthetic-days", "400", "--window", "6",
            "--episode-days", "20", "--num-envs", "4", "--rollout-steps", "8", "--batch-size", "32", "--hidden", "8",
            "--total-steps", "64", "--eval-every", "1", "--seeds", "1", "--no-baseline-mlp", "--random-runs", "1",
            "--encoder", "mlp", "--val-frac", "0.1", "--test-frac", "0.1", "--device", "cpu",
            "--run-dir", str(tmp_path / "run")]
    assert main(args) == 0
    assert len(checked) == 2 * 8, f"{len(checked)} rollout steps, not 2 updates of 8"
    assert all(checked), f"{checked.count(False)} of {len(checked)} steps saw another date"


def test_no_indicator_at_or_before_t_moves_when_the_next_days_change():
    """Every price after t rewritten, the day after t included: rows 0..t of every indicator must not
    move, and later rows must (the rewrite has teeth)."""
    panel = to_panel(synthetic_market(n_tickers=3, n_days=300, seed=2))
    close, high, low = panel.close, panel.high, panel.low
    base = indicators(close, high, low)
    rng = np.random.default_rng(5)
    for t in range(25, len(close) - 1, 9):
        scale = np.exp(rng.normal(0, 0.05, (len(close) - t - 1, close.shape[1])))
        c, h, lo = close.copy(), high.copy(), low.copy()
        c[t + 1:] *= scale
        h[t + 1:] = np.maximum(h[t + 1:] * scale, c[t + 1:])
        lo[t + 1:] = np.minimum(lo[t + 1:] * scale, c[t + 1:])
        after = indicators(c, h, lo)
        np.testing.assert_array_equal(base[: t + 1], after[: t + 1], err_msg=f"an indicator at or before day {t} moved")
        assert not np.allclose(base[t + 1:], after[t + 1:], equal_nan=True)
