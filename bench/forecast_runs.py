"""What the forecaster's benchmarks share: the demo command with some flags, run under torchrun, and
the figures of one forecast in one split of its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

FORECASTS = ("model", "ridge", "lightgbm", "persistence", "ensemble")


def demo_command(flags: list[str], nproc: int = 2) -> str:
    return (f"torchrun --standalone --nproc_per_node={nproc} -m trainers forecast train --run-dir DIR "
            + " ".join(flags)).strip()


def cores() -> dict:
    """Where this benchmark ran: the CPU cores it was allowed (taskset) and its thread setting; its
    torchrun workers inherit both."""
    return {"cores_allowed": sorted(os.sched_getaffinity(0)), "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "gpu": False}


def run_demo(flags: list[str], run_dir: Path, nproc: int = 2) -> tuple[dict, float]:
    """(results.json, wall seconds) of the README's demo command with `flags` added."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "trainers", "forecast", "train", "--run-dir", str(run_dir), *flags]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    return json.loads((Path(run_dir) / "results.json").read_text()), wall


def figures(split: dict, name: str) -> dict:
    """One forecast's figures in one split of an evaluation: the model's (with its verdict and its
    Rank IC minus each other forecast's, date by date, with the Newey-West standard error) or a
    baseline's."""
    m = split["model"] if name == "model" else split["baselines"][name]
    if "skipped" in m:
        return {"skipped": m["skipped"]}
    out = {"ic": m["ic"]["mean"], "rank_ic": m["rank_ic"]["mean"], "rank_ic_std": m["rank_ic"]["std"],
           "rank_icir": m["rank_ic"]["icir"], "rank_ic_t": m["rank_ic"]["t"], "rank_ic_t_nw": m["rank_ic"]["t_nw"],
           "positive_share": m["rank_ic"]["positive_share"],
           "long_short": {k: m["long_short"][k] for k in ("ann_return", "sharpe", "max_drawdown", "turnover")},
           "long_only": {k: m["long_only"][k] for k in ("ann_return", "sharpe", "max_drawdown", "turnover")},
           "mse": m["mse"], "directional_accuracy": m["directional_accuracy"]}  # None for the ensemble's ranks
    if name == "model":
        out["minus"] = {k: {"mean": v["mean"], "se_nw": v["se_nw"], "t_nw": v["t_nw"]}
                        for k, v in split["model_minus_rank_ic"].items()}
        out["verdict"] = split["verdict"]
    return out


def split_table(split: dict) -> dict:
    """Every forecast's figures in one split, and equal-weight's."""
    out = {name: figures(split, name) for name in FORECASTS}
    ew = split["equal_weight"]
    out["equal_weight"] = {k: ew[k] for k in ("ann_return", "sharpe", "max_drawdown", "turnover")}
    out["verdict"] = split["verdict"]
    out["verdict_reason"] = split["verdict_reason"]
    return out
