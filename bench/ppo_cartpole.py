"""Benchmark: environment steps the trainer's PPO needs to solve gymnasium's CartPole-v1, over seeds.

    OMP_NUM_THREADS=1 python bench/ppo_cartpole.py --seeds 10 --out bench/results/ppo_cartpole_cpu.json

Runs exactly what tests/ppo/test_ppo_cartpole.py runs (tests/ppo/cartpole.py: trainers.ppo.ppo with
CleanRL's MLP agent, rl-zoo's tuned CartPole hyperparameters, 8 environments x 32 steps per update),
once per seed. "Solved" is the README's (and CleanRL's / SB3's) bar: the mean return of the last 100
finished episodes >= 475, checked after every update (so steps come in multiples of 256); a seed
that does not get there within --max-steps is recorded as unsolved, not dropped. Steps to solve are
summarised over the solved seeds as mean +- std (ddof=1), with the number solved beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import gymnasium
import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "ppo"))  # the test's own CartPole driver, not a copy

from cartpole import train_cartpole  # noqa: E402
from record import write_record  # noqa: E402

SOLVED = 475.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1")
    p.add_argument("--max-steps", type=int, default=500_000, help="the bar: CleanRL's and the test's budget")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    runs = []
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        returns, steps = train_cartpole(args.max_steps, seed=seed, stop_at=SOLVED)
        wall = time.perf_counter() - t0
        last100 = float(np.mean(returns[-100:])) if len(returns) >= 100 else None
        solved = last100 is not None and last100 >= SOLVED
        runs.append({"seed": seed, "solved": solved, "env_steps": steps, "wall_s": wall, "episodes": len(returns),
                     "mean_return_last_100": last100})
        print(f"seed {seed}: {'solved' if solved else 'NOT solved'} after {steps} steps, {wall:.1f} s", flush=True)
    solved = [r for r in runs if r["solved"]]
    steps = np.array([r["env_steps"] for r in solved], dtype=float)
    walls = np.array([r["wall_s"] for r in solved], dtype=float)

    def stats(x: np.ndarray) -> dict | None:
        if len(x) == 0:
            return None
        return {"mean": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
                "min": float(x.min()), "max": float(x.max())}

    write_record({"benchmark": "ppo_cartpole", "device": "cpu", "torch_threads": args.threads,
                  "load_average_1_5_15": os.getloadavg(), "task": "gymnasium CartPole-v1",
                  "gymnasium": gymnasium.__version__,
                  "solved_definition": f"mean return of the last 100 finished episodes >= {SOLVED:g}, checked "
                                       "after every PPO update",
                  "settings": "tests/ppo/cartpole.py: 8 envs x 32 steps, 20 epochs, minibatch 256, gamma 0.98, "
                              "lambda 0.8, lr 1e-3 annealed over max_steps, ent_coef 0, max_grad_norm 0.5",
                  "max_steps": args.max_steps, "seeds": args.seeds, "solved": len(solved),
                  "steps_to_solve": stats(steps), "wall_s_to_solve": stats(walls), "runs": runs}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
