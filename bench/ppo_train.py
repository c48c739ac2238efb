"""Benchmark: whole-training throughput (environment steps per second of wall time, everything
included) of `trainers ppo train` beside what a FinRL user runs instead: Stable-Baselines3's PPO
(MlpPolicy, its defaults) on FinRL's StockTradingEnv in a DummyVecEnv, same market, same budget.

    python bench/ppo_train.py --steps 16384 --out bench/results/ppo_train_cpu.json

Ours runs in-process through trainers.ppo.train.train with the default config (30 stocks, window
30, 64 environments x 64 steps per update, 4 epochs of minibatch 512) for the cascaded LSTM and for
the MLP encoder; one agent each, one process. Wall time is measured around the call; the trainer's
own steady-state figure (log windows after the first) is reported beside it. stable-baselines3 is a
benchmark-only dependency (never needed by the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finrl_env import finrl_frame, make_finrl_env  # noqa: E402
from record import write_record  # noqa: E402

from trainers.market.panel import to_panel  # noqa: E402
from trainers.market.synthetic import synthetic_market  # noqa: E402
from trainers.ppo.config import PpoConfig  # noqa: E402
from trainers.ppo.features import build_trading_data  # noqa: E402


def ours(encoder: str, steps: int, workdir: Path) -> dict:
    from trainers.ppo.train import train

    cfg = PpoConfig(run_dir=str(workdir / f"ours-{encoder}"), encoder=encoder, baseline_mlp=False, seeds=1,
                    total_steps=steps, device="cpu", eval_every=1000, log_every=1, random_runs=1)
    t0 = time.perf_counter()
    results = train(cfg)
    wall = time.perf_counter() - t0
    t = results["training"]
    done = t["steps"] * t["env_steps_per_update"]
    return {"env_steps": done, "wall_s": wall, "env_steps_per_s_wall": done / wall,
            "env_steps_per_s_steady": t["throughput"]["per_s_steady"], "parameters": results["model"]["parameters"],
            "breakdown_s": t["throughput"]["breakdown_s"]}


def sb3(frame, n_stocks: int, steps: int) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    t0 = time.perf_counter()
    env = DummyVecEnv([lambda: make_finrl_env(frame, n_stocks)])
    model = PPO("MlpPolicy", env, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - t0
    return {"env_steps": int(model.num_timesteps), "wall_s": wall, "env_steps_per_s_wall": model.num_timesteps / wall,
            "parameters": sum(p.numel() for p in model.policy.parameters()),
            "settings": "PPO('MlpPolicy') defaults: n_steps 2048, batch 64, 10 epochs; DummyVecEnv of 1 FinRL env"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16384)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data, _ = build_trading_data(to_panel(synthetic_market(n_tickers=30, n_days=2520, seed=0)), 30, 30, 0.15, 0.15, 20)
    a, z = data.splits["train"]
    frame = finrl_frame(data.close[a:z], data.features[a:z], data.tickers, data.dates[a:z])
    with tempfile.TemporaryDirectory() as tmp:
        record = {"benchmark": "ppo_train", "load_average_1_5_15": os.getloadavg(), "device": "cpu", "torch_threads": args.threads, "budget_env_steps": args.steps,
                  "market": "synthetic, 30 stocks, training period", "ours_clstm": ours("clstm", args.steps, Path(tmp)),
                  "ours_mlp": ours("mlp", args.steps, Path(tmp)),
                  "sb3_ppo_finrl_env": sb3(frame, data.n_stocks, args.steps)}
    for k in ("ours_clstm", "ours_mlp"):
        record[f"speedup_{k}_vs_sb3"] = (record[k]["env_steps_per_s_wall"]
                                         / record["sb3_ppo_finrl_env"]["env_steps_per_s_wall"])
    print(json.dumps({k: v for k, v in record.items() if not isinstance(v, dict)}, indent=1))
    write_record(record, args.out)


if __name__ == "__main__":
    main()
