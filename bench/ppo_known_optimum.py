"""Benchmark: does the cascaded-LSTM PPO agent reach a known optimum, and does it need the prices to?

    OMP_NUM_THREADS=1 python bench/ppo_known_optimum.py --out bench/results/ppo_known_optimum_cpu.json

The markets and configurations are tests/ppo/test_ppo_known_optimum.py's own (imported, not copied):

    drift      stock A rises 0.4 %/day, B and C fall 0.1 %/day: the optimum holds A only (a constant
               portfolio). CLSTM and MLP encoders over --seeds seeds at the test's budget, the CLSTM
               with its market input zeroed ("blind": can a constant portfolio be learnt without
               prices? it can), and an untrained CLSTM (lr 1e-12) as the floor.
    rotating   the riser changes every 20 days: the oracle holds the day's riser, which only the
               window shows. The test's CLSTM (hidden 64, gamma 0.5) over seeds, blind, the MLP
               encoder, the CLSTM at the drifting test's hidden 32 / gamma 0.9 (why the test does not
               use them), and the test's CLSTM at 4x the budget (where it levels off).

Each run is one agent through trainers.ppo.train.train on a CSV file, in-process, one torch thread.
Recorded per run: wall time, the test period's log growth as a share of the optimum's (oracle's)
(percent; references beside it: the momentum reading, the best stock and the equal-weight portfolio
held through the test period), and the learning curve: the deterministic policy's validation return at every
validation point, also as a share of the validation period's optimum. The momentum reference
(hold the best of the last `window` days, no cost) says what a plain reading of the window gets.
Figures are rounded to 0.01 in the units the README prints (percent).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "ppo"))

import test_ppo_known_optimum as K  # noqa: E402
from record import write_record  # noqa: E402

from trainers.ppo.config import PpoConfig  # noqa: E402
from trainers.ppo.model import TradingActorCritic  # noqa: E402
from trainers.ppo.train import train  # noqa: E402

MARKETS = {"drift": K.drift_market, "rotating": K.rotating_market}


@contextlib.contextmanager
def blind_agent():
    """The trading network with its market window replaced by zeros: it still sees its own weights."""
    forward = TradingActorCritic.forward
    TradingActorCritic.forward = lambda self, market, portfolio: forward(self, torch.zeros_like(market), portfolio)
    try:
        yield
    finally:
        TradingActorCritic.forward = forward


def pct(x: float) -> float:
    return round(100.0 * x, 2)


def one_run(market: str, config: dict, encoder: str, seed: int, blind: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        close, riser = MARKETS[market](Path(tmp) / "market.csv")
        cfg = PpoConfig(run_dir=f"{tmp}/run", source=f"file:{tmp}/market.csv", encoder=encoder,
                        **{**config, "seed": seed})
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), blind_agent() if blind else contextlib.nullcontext():
            results = train(cfg)
        wall = time.perf_counter() - t0
        val = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
               if '"kind": "val"' in line]
    ev = results["evaluation"]
    agent = ev["table"][f"ppo_{encoder}"]["per_seed"][0]
    first = K.date_index(close, ev["test_dates"][0])
    days = agent["days"]
    oracle = K.oracle_log_growth(close, riser, first, days)
    got = float(np.log1p(agent["cumulative_return"]))
    v_first, _v_last, v_days = results["data"]["decision_dates"]["val"]
    v_oracle = K.oracle_log_growth(close, riser, K.date_index(close, v_first), v_days)
    per_update = results["training"]["env_steps_per_update"]
    curve = {str(r["update"]): {"env_steps": r["update"] * per_update, "val_return_pct": pct(r["val_return"]),
                                "val_share_of_optimum_pct": pct(np.log1p(r["val_return"]) / v_oracle)} for r in val}
    held = np.log(close[first + days] / close[first])  # every stock bought at the first close and held
    refs = {"momentum_share_of_optimum_pct": pct(K.momentum_log_growth(close, first, days, config["window"]) / oracle),
            "best_stock_held_share_of_optimum_pct": pct(float(held.max()) / oracle),
            "equal_weight_held_share_of_optimum_pct": pct(float(np.log(np.mean(np.exp(held)))) / oracle)}
    return {"encoder": encoder, "seed": seed, "blind": blind, "wall_s": round(wall, 1),
            "env_steps": results["training"]["steps"] * per_update,
            "config": {k: config[k] for k in ("hidden", "gamma", "lr", "total_steps", "window")},
            "test_log_growth": got, "test_optimum_log_growth": oracle, "test_share_of_optimum_pct": pct(got / oracle),
            "test_cumulative_return_pct": pct(agent["cumulative_return"]), "selected_update": agent["selected_update"],
            "val_optimum_log_growth": v_oracle, "references": refs, "curve": curve}


def stats(values) -> dict:
    x = np.asarray(values, dtype=float)
    return {"n": len(x), "mean": round(float(x.mean()), 2), "std": round(float(x.std(ddof=1)), 2) if len(x) > 1 else 0.0,
            "min": float(x.min()), "max": float(x.max()), "values": x.tolist()}


def summary(runs: list[dict]) -> dict:
    """The test share over seeds, and the learning curve's validation share at each validation point."""
    updates = runs[0]["curve"].keys()
    return {"test_share_of_optimum_pct": stats([r["test_share_of_optimum_pct"] for r in runs]),
            "wall_s": stats([r["wall_s"] for r in runs]),
            "curve": {u: {"env_steps": runs[0]["curve"][u]["env_steps"],
                          "val_share_of_optimum_pct": stats([r["curve"][u]["val_share_of_optimum_pct"] for r in runs])}
                      for u in updates}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=4, help="seeds of the drifting market's CLSTM and MLP")
    p.add_argument("--rotating-seeds", type=int, default=3, help="seeds of the rotating market's CLSTM")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    record: dict = {"benchmark": "ppo_known_optimum", "device": "cpu", "torch_threads": 1,
                    "load_average_1_5_15_at_start": os.getloadavg(),
                    "test_config": K.CONFIG, "rotating_test_config": K.ROTATING,
                    "test_thresholds": {"drift_share": K.DRIFT_SHARE, "rotating_share": K.ROTATING_SHARE}}

    def log(name: str, r: dict) -> dict:
        print(json.dumps({"run": name, "wall_s": r["wall_s"], "share_pct": r["test_share_of_optimum_pct"],
                          "selected_update": r["selected_update"]}), flush=True)
        return r

    drift = {}
    for enc in ("clstm", "mlp"):
        runs = [log(f"drift/{enc}/seed{s}", one_run("drift", K.CONFIG, enc, s)) for s in range(args.seeds)]
        drift[enc] = {"summary": summary(runs), "runs": {f"seed{r['seed']}": r for r in runs}}
    drift["references"] = drift["clstm"]["runs"]["seed0"]["references"]  # the same test period in every run
    drift["clstm_blind"] = log("drift/clstm_blind", one_run("drift", K.CONFIG, "clstm", 0, blind=True))
    untrained = {**K.CONFIG, "lr": 1e-12, "total_steps": 4 * K.CONFIG["num_envs"] * K.CONFIG["rollout_steps"]}
    drift["clstm_untrained"] = log("drift/clstm_untrained", one_run("drift", untrained, "clstm", 0))
    record["drift"] = drift

    rot = {}
    runs = [log(f"rotating/clstm/seed{s}", one_run("rotating", K.ROTATING, "clstm", s))
            for s in range(args.rotating_seeds)]
    rot["clstm"] = {"summary": summary(runs), "runs": {f"seed{r['seed']}": r for r in runs}}
    rot["references"] = runs[0]["references"]
    rot["clstm_blind"] = log("rotating/clstm_blind", one_run("rotating", K.ROTATING, "clstm", 0, blind=True))
    rot["mlp"] = log("rotating/mlp", one_run("rotating", K.ROTATING, "mlp", 0))
    # (no dot in a key: the README's claims are dotted paths into this JSON)
    rot["clstm_hidden32_gamma_0_9"] = log("rotating/clstm_h32_g0.9", one_run("rotating", K.CONFIG, "clstm", 0))
    longer = {**K.ROTATING, "total_steps": 4 * K.ROTATING["total_steps"], "eval_every": 16}
    rot["clstm_4x_budget"] = log("rotating/clstm_4x", one_run("rotating", longer, "clstm", 0))
    record["rotating"] = rot
    record["wall_s_total"] = round(time.perf_counter() - t_start, 1)
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
