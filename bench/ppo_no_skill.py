"""Benchmark: the README's "small honest run" of `trainers ppo train` on the synthetic market, and
its test-period table (the CLSTM and MLP agents beside the equal-weight baselines and a random policy).

    python bench/ppo_no_skill.py --out bench/results/ppo_no_skill_cpu.json

Runs the README's command through the CLI in a fresh folder (one process, OMP_NUM_THREADS=1) and
records its wall time, the data split, the per-seed and summary rows of the test table (cumulative
return and Sharpe, mean +- std over seeds, or over runs for the random policy), each agent's
selected update and the verdict, so the README quotes these numbers from here, not from a log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

ARGS = ["--device", "cpu", "--synthetic-tickers", "10", "--num-stocks", "10", "--window", "10", "--hidden", "32",
        "--num-envs", "32", "--rollout-steps", "32", "--batch-size", "256", "--episode-days", "63",
        "--total-steps", "49152", "--seeds", "2", "--action", "weights", "--eval-every", "4"]
METRICS = ("cumulative_return", "sharpe", "max_drawdown", "turnover")


def rows(table: dict) -> dict:
    out = {}
    for name, row in table.items():
        summary = row["summary"]
        out[name] = {"n": summary["n"], **{k: {"mean": summary[k]["mean"], "std": summary[k]["std"],
                                               "values": summary[k]["values"]} for k in METRICS if k in summary}}
        # as the README prints them: percent to 0.01 (returns) and Sharpe to 0.01
        out[name]["printed"] = {"cumulative_return_pct": {s: round(100 * summary["cumulative_return"][s], 2)
                                                          for s in ("mean", "std")},
                                "sharpe": {s: round(summary["sharpe"][s], 2) for s in ("mean", "std")}}
        if "per_seed" in row and row["per_seed"] and "selected_update" in row["per_seed"][0]:
            out[name]["selected_update"] = [r["selected_update"] for r in row["per_seed"]]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "ppo_demo"
        cmd = [sys.executable, "-m", "trainers", "ppo", "train", "--run-dir", str(run_dir), *ARGS]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            return proc.returncode
        r = json.loads((run_dir / "results.json").read_text())
    e = r["evaluation"]
    record = {"benchmark": "ppo_no_skill", "device": "cpu", "omp_num_threads": 1,
              "load_average_1_5_15": os.getloadavg(),
              "run_command": "OMP_NUM_THREADS=1 trainers ppo train --run-dir DIR " + " ".join(ARGS),
              "wall_s": wall, "data": {"source": r["data"]["source"],
                                       "decision_dates": r["data"].get("decision_dates")},
              "test_dates": e["test_dates"], "test_days": e["test_days"], "cost_bps": e["cost_bps"],
              "action": e["action"], "selection": e["selection"], "table": rows(e["table"]),
              "verdict": e["verdict"]}
    print(json.dumps({k: record[k] for k in ("wall_s", "test_days")}), flush=True)
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
