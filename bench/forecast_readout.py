"""Benchmark: why the forecaster reads out at the last day, and whether the tiny preset wants a
larger LR.

Trains the demo configuration of 89e0c69 (its model: no linear skip, no past returns; every other
default but --epochs and --lr) in one process, four times: the window-mean readout (--readout
mean) the model had before and the last-day one (--readout last), each at LR 1e-3 and 2e-3, and
records the validation Rank IC and loss (the test split is not looked at: this is a model choice).
Measured (2026-11-22, 2-core CPU): the readout doubles the validation Rank IC (0.050 -> 0.137 at
1e-3); with it, 2e-3 is no better than 1e-3 (0.132), so 1e-3 stays. bench/forecast_ablation.py has
since measured the readouts with the linear skip and past returns.

    python bench/forecast_readout.py --epochs 4 --out bench/results/forecast_readout_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from record import write_record  # noqa: E402

from trainers.forecast.config import ForecastConfig  # noqa: E402
from trainers.forecast.train import train  # noqa: E402

# The model of 89e0c69 in every other respect (the options added since, off): this bench measured it.
BEFORE = {"linear_skip": False, "past_returns": False, "encoder": "transformer"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for readout, option in (("window_mean", "mean"), ("last_day", "last")):
            for lr in (1e-3, 2e-3):
                t0 = time.perf_counter()
                r = train(ForecastConfig(run_dir=f"{tmp}/{readout}-{lr}", epochs=args.epochs, lr=lr, device="cpu",
                                         log_every=50, readout=option, **BEFORE))
                val = r["evaluation"]["val"]
                row = {"readout": readout, "lr": lr, "epochs": args.epochs, "wall_s": time.perf_counter() - t0,
                       "val_rank_ic": val["model"]["rank_ic"]["mean"], "val_rank_ic_t_nw": val["model"]["rank_ic"]["t_nw"],
                       "val_ic": val["model"]["ic"]["mean"], "best_val_loss": r["training"]["best_val"]["value"],
                       "initial_val_loss": r["training"]["initial_val"],
                       "ridge_val_rank_ic": val["baselines"]["ridge"]["rank_ic"]["mean"]}
                runs.append(row)
                print(json.dumps(row), flush=True)
    write_record({"benchmark": "forecast_readout", "device": "cpu", "world_size": 1, "threads": torch.get_num_threads(),
                  "synthetic": True, "runs": runs}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
