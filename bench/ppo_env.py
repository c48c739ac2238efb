"""Benchmark: environment steps per second of the vectorised portfolio environment (trainers.ppo.env)
beside FinRL's StockTradingEnv in gymnasium's SyncVectorEnv, on the same market, on the CPU.

    python bench/ppo_env.py --out bench/results/ppo_env_cpu.json

The market: the synthetic one (30 stocks, 2520 days), its training period. For each B: random
actions in [-1, 1] (drawn before timing), `trades` mode, 10 bp costs. Two numbers for ours: the step
alone (trade, revalue, reward, auto-reset, portfolio weights) and the step plus the full observation
the agent reads ([B, window 30, 30 stocks, 6 features] gathered by date). FinRL's step returns its
whole state (cash, prices, holdings, today's indicators). One environment step = one portfolio-day.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finrl_env import finrl_env_class, finrl_frame, make_finrl_env  # noqa: E402
from record import write_record  # noqa: E402

from trainers.market.panel import to_panel  # noqa: E402
from trainers.market.synthetic import synthetic_market  # noqa: E402
from trainers.ppo.env import DeviceMarket, EnvSpec, VecPortfolioEnv  # noqa: E402
from trainers.ppo.features import build_trading_data  # noqa: E402


def timed(fn, min_s: float, min_iters: int) -> tuple[float, int]:
    fn()  # warm-up
    iters, t0 = 0, time.perf_counter()
    while iters < min_iters or time.perf_counter() - t0 < min_s:
        fn()
        iters += 1
    return time.perf_counter() - t0, iters


def ours(data, b: int, window: int, device: torch.device, with_obs: bool, min_s: float) -> dict:
    market = DeviceMarket(data.close, data.features, device)
    env = VecPortfolioEnv(market, EnvSpec(window=window, episode_days=252), b, data.splits["train"], seed=0)
    actions = [torch.rand(b, data.n_stocks, generator=torch.Generator().manual_seed(i)).to(device) * 2 - 1
               for i in range(16)]
    k = [0]

    def step():
        (t, _portfolio), _r, _d, _i = env.step(actions[k[0] % 16])
        if with_obs:
            market.windows(t, window)
        k[0] += 1
    seconds, iters = timed(step, min_s, 20)
    return {"env_steps_per_s": b * iters / seconds, "vector_steps": iters, "seconds": seconds}


def finrl(frame, n_stocks: int, b: int, min_s: float) -> dict:
    import gymnasium as gym

    vec = gym.vector.SyncVectorEnv([lambda: make_finrl_env(frame, n_stocks) for _ in range(b)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    vec.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-1, 1, (b, n_stocks)).astype(np.float32) for _ in range(16)]
    k = [0]

    def step():
        vec.step(actions[k[0] % 16])
        k[0] += 1
    seconds, iters = timed(step, min_s, 3)
    vec.close()
    return {"env_steps_per_s": b * iters / seconds, "vector_steps": iters, "seconds": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,64,1024,4096")
    p.add_argument("--finrl-sizes", default="1,64,1024", help="FinRL at 4096 takes minutes per measurement")
    p.add_argument("--window", type=int, default=30)
    p.add_argument("--min-seconds", type=float, default=2.0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (FinRL steps in one Python thread)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data, _ = build_trading_data(to_panel(synthetic_market(n_tickers=30, n_days=2520, seed=0)), 30, args.window,
                                 0.15, 0.15, 20)
    a, z = data.splits["train"]
    frame = finrl_frame(data.close[a:z], data.features[a:z], data.tickers, data.dates[a:z])
    _, finrl_path = finrl_env_class()
    rows = []
    for b in [int(x) for x in args.sizes.split(",")]:
        row = {"B": b, "ours_step": ours(data, b, args.window, device, False, args.min_seconds),
               "ours_step_and_window_obs": ours(data, b, args.window, device, True, args.min_seconds)}
        if str(b) in args.finrl_sizes.split(","):
            row["finrl_sync_vector"] = finrl(frame, data.n_stocks, b, args.min_seconds)
            row["speedup_step"] = row["ours_step"]["env_steps_per_s"] / row["finrl_sync_vector"]["env_steps_per_s"]
            row["speedup_step_and_window_obs"] = (row["ours_step_and_window_obs"]["env_steps_per_s"]
                                                  / row["finrl_sync_vector"]["env_steps_per_s"])
        rows.append(row)
        print({k: (round(v["env_steps_per_s"]) if isinstance(v, dict) else v) for k, v in row.items()}, flush=True)
    write_record({"benchmark": "ppo_env", "load_average_1_5_15": os.getloadavg(), "device": str(device), "torch_threads": torch.get_num_threads(),
                  "n_stocks": data.n_stocks, "window": args.window, "features": 6, "action": "trades",
                  "finrl_env": f"finrl StockTradingEnv (real package, loaded from {Path(finrl_path).name}) in "
                               "gymnasium SyncVectorEnv (same-step autoreset)",
                  "rows": rows}, args.out)


if __name__ == "__main__":
    main()
