"""FinRL's own StockTradingEnv (finrl 0.3.x, `pip install finrl --no-deps`) on our market data.

The `finrl` package's __init__ imports its whole stack (alpaca, yfinance wrappers, ...), so the
environment's module is loaded from its file: the code that runs is FinRL's, unchanged. It needs
gymnasium, matplotlib and stable-baselines3 (its module imports DummyVecEnv).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

FINRL_ENV_FILE = "finrl/meta/env_stock_trading/env_stocktrading.py"
TECH = ["macd", "rsi_14", "cci_20", "adx_14", "vol_20d", "ret_1d"]


def finrl_env_class():
    spec = importlib.util.find_spec("finrl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("finrl is not installed: pip install finrl --no-deps (plus gymnasium, matplotlib, "
                         "stable-baselines3)")
    path = Path(list(spec.submodule_search_locations)[0]).parent / FINRL_ENV_FILE
    module_spec = importlib.util.spec_from_file_location("finrl_env_stocktrading", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.StockTradingEnv, str(path)


def finrl_frame(close: np.ndarray, features: np.ndarray, tickers: list[str], dates: list[str]) -> pd.DataFrame:
    """FinRL's layout: one row per (date, tic), indexed by the day number, the features as tech columns."""
    n_days, n = close.shape
    frame = pd.DataFrame({"date": np.repeat(dates, n), "tic": np.tile(tickers, n_days), "close": close.ravel()})
    for i, name in enumerate(TECH):
        frame[name] = features[:, :, i].ravel()
    frame.index = np.repeat(np.arange(n_days), n)
    return frame


def make_finrl_env(frame: pd.DataFrame, n_stocks: int, cost: float = 0.001, hmax: int = 100,
                   initial_amount: float = 1_000_000):
    cls, _ = finrl_env_class()
    return cls(df=frame, stock_dim=n_stocks, hmax=hmax, initial_amount=initial_amount, num_stock_shares=[0] * n_stocks,
               buy_cost_pct=[cost] * n_stocks, sell_cost_pct=[cost] * n_stocks, reward_scaling=1e-4,
               state_space=1 + 2 * n_stocks + len(TECH) * n_stocks, action_space=n_stocks, tech_indicator_list=TECH,
               print_verbosity=10**9)
