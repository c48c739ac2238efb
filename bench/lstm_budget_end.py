"""Benchmark: how far past its budget an LSTM job ends, and what it trained inside it (trainers.lstm.wind_down).
Two jobs, each a command of its own in a process of its own, one after another, in one run:

    python bench/lstm_budget_end.py --out bench/results/lstm_budget_end_cpu.json

- `one_cohort`: 64 small symbols in one cohort, --max-hours 0.001 (3.6 s): the budget runs out in the worker's
  first cohort, before any symbol's end is measured (only the summary and the exit are kept then);
- `cohorts_of_32`: 128 small symbols in cohorts of 32, --max-hours 0.004 (14.4 s): the budget runs out in a later
  cohort, the ends measured on the first.

`--jobs gpu` (bench/gpu_session.sh 38): the 500-symbol job as a GPU deploy runs it (the default model, cohorts
sized for the card, exports behind; 75 s planned on the H200), with a 45-s budget, and the same in cohorts of 64.

Per job: the budget in seconds, the job's elapsed time (its results.json: from the start of `train` to its
summary), how far past the budget that is (0 inside it; computed here, so the benchmark reads a job of an older
commit too), the command's wall time, the symbols ok / stopped / pending, the steps trained, and the stop line the
job logged. The machine is shared: seconds move a little between runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--synthetic-days", "800", "--window", "16", "--hidden", "16", "--layers", "2", "--batch-size", "64",
         "--patience", "0", "--device", "cpu"]
JOBS = {"small": {"one_cohort": [*SMALL, "--synthetic-tickers", "64", "--epochs", "20", "--cohort", "64",
                                  "--max-hours", "0.001"],
                   "cohorts_of_32": [*SMALL, "--synthetic-tickers", "128", "--epochs", "3", "--cohort", "32",
                                     "--max-hours", "0.004"]},
        "gpu": {"default_500": ["--synthetic-tickers", "500", "--device", "auto", "--max-hours", "0.0125"],
                "cohorts_of_64_500": ["--synthetic-tickers", "500", "--device", "auto", "--cohort", "64",
                                      "--max-hours", "0.0125"]}}


def run_job(args: list[str], run_dir: Path) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trainers", "lstm", "train", "--run-dir", str(run_dir), *args],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"the job failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    t = json.loads((run_dir / "results.json").read_text())["training"]
    budget = float(args[args.index("--max-hours") + 1]) * 3600.0
    stop = [line.split(" INFO ", 1)[-1] for line in proc.stderr.splitlines() if "stopping the job" in line]
    return {"budget_s": budget, "job_elapsed_s": t["elapsed_s_all_attempts"],
            "over_budget_s": max(0.0, t["elapsed_s_all_attempts"] - budget), "command_wall_s": wall,
            "stop_reason": t["stop_reason"], "symbols": t["symbols"], "steps": t["steps"],
            "stop_logged": stop[0] if stop else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--jobs", choices=tuple(JOBS), default="small")
    args = p.parse_args()
    jobs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, job_args in JOBS[args.jobs].items():
            jobs[name] = {"args": job_args, **run_job(job_args, Path(tmp) / name)}
            print(name, json.dumps({k: v for k, v in jobs[name].items() if k != "args"}), flush=True)
    write_record({"benchmark": "lstm_budget_end", "jobs": jobs}, args.out)


if __name__ == "__main__":
    main()
