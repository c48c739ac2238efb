"""Benchmark: the LSTM's one training loop (issue 61) against the two loops it replaced, on the same machine in one
run. `--before DIR` is a checkout of the kit before the change (git worktree add DIR <commit>).

Results: a 16-symbol job (bench/lstm_pack.py's small shape, fp32 on the CPU) at --cohort 1 (each symbol alone,
once trainers.lstm.train.train_symbol, now a cohort of one with nn.LSTM's fused kernel) and at --cohort 16 (what
--cohort auto gives 16 symbols on a GPU: one stacked cohort), in both trees; every number under each symbol's
results.json "evaluation" and "training.best_val", and its steps, compared.

Speed: bench/lstm_pack.py's cohort job (64 symbols, --cohort 1 and --cohort 64), the trees taking turns,
`--repeats` times each; the job's own wall time (results.json), the median per tree.

    git worktree add /tmp/before <commit>
    python bench/lstm_one_loop.py --before /tmp/before --out bench/results/lstm_one_loop_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lstm_pack import SHRUNK  # noqa: E402
from record import write_record  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


def run_job(tree: Path, run_dir: Path, symbols: int, cohort: int) -> dict:
    """`trainers lstm train` from `tree` (its own package first on the path), one process, one thread."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    env.pop("TRAINERS_FAULT", None)
    subprocess.run([sys.executable, "-m", "trainers", "lstm", "train", "--run-dir", str(run_dir), "--synthetic-tickers",
                    str(symbols), *SHRUNK, "--cohort", str(cohort)], check=True, capture_output=True, text=True,
                   env=env, cwd=tree)
    return json.loads((run_dir / "results.json").read_text())


def numbers(tree, prefix: str = "") -> dict[str, float]:
    """Every number in a JSON tree, by its path."""
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in numbers(value, f"{prefix}{key}.").items()}
    if isinstance(tree, list):
        return {k: v for i, value in enumerate(tree) for k, v in numbers(value, f"{prefix}{i}.").items()}
    if isinstance(tree, (int, float)) and not isinstance(tree, bool):
        return {prefix.rstrip("."): float(tree)}
    return {}


def symbol_metrics(run_dir: Path) -> dict[str, dict[str, float]]:
    out = {}
    for path in sorted(run_dir.glob("symbols/*/results.json")):
        r = json.loads(path.read_text())
        out[path.parent.name] = {**numbers(r["evaluation"], "evaluation."),
                                 **numbers(r["training"]["best_val"], "best_val."), "steps": float(r["training"]["steps"])}
    return out


def compare(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict:
    if sorted(before) != sorted(after):
        return {"same_symbols": False, "before": sorted(before), "after": sorted(after)}
    keys_differ = [s for s in before if sorted(before[s]) != sorted(after[s])]
    diffs = [abs(before[s][k] - after[s][k]) for s in before for k in before[s] if k in after[s]
             and before[s][k] == before[s][k] and after[s][k] == after[s][k]]  # (NaN against NaN: both not a number)
    nan_mismatch = sum((before[s][k] != before[s][k]) != (after[s][k] != after[s][k])
                       for s in before for k in before[s] if k in after[s])
    return {"same_symbols": True, "symbols": len(before), "numbers_compared": len(diffs),
            "symbols_whose_keys_differ": keys_differ, "nan_mismatches": nan_mismatch,
            "max_abs_difference": max(diffs) if diffs else None,
            "identical": not keys_differ and not nan_mismatch and max(diffs, default=0.0) == 0.0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="a checkout of the kit before the change")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: give 1 or more (the speed is the median of the repeats)")
    before_tree = Path(args.before).resolve()
    trees = {"before": before_tree, "after": HERE}
    commit = subprocess.run(["git", "-C", str(before_tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    load_at_start = os.getloadavg()
    results, walls = {}, {(name, k): [] for name in trees for k in (1, 64)}
    with tempfile.TemporaryDirectory() as tmp:
        for k in (1, 16):
            metrics = {}
            for name, tree in trees.items():
                run_job(tree, Path(tmp) / f"{name}-same-{k}", 16, k)
                metrics[name] = symbol_metrics(Path(tmp) / f"{name}-same-{k}")
            results[f"16 symbols, cohort {k}"] = compare(metrics["before"], metrics["after"])
            print(json.dumps({k: results[f"16 symbols, cohort {k}"]}), flush=True)
        for repeat in range(args.repeats):
            for k in (1, 64):
                for name, tree in (trees.items() if repeat % 2 == 0 else reversed(trees.items())):  # taking turns
                    started = time.perf_counter()
                    r = run_job(tree, Path(tmp) / f"{name}-speed-{k}-{repeat}", 64, k)
                    walls[(name, k)].append({"job_wall_s": r["training"]["wall_time_s_this_attempt"],
                                             "command_wall_s": time.perf_counter() - started})
                    print(json.dumps({"tree": name, "cohort": k, **walls[(name, k)][-1]}), flush=True)
    speed = {}
    for k in (1, 64):
        median = {name: statistics.median(w["job_wall_s"] for w in walls[(name, k)]) for name in trees}
        speed[f"64 symbols, cohort {k}"] = {"job_wall_s": {name: [w["job_wall_s"] for w in walls[(name, k)]]
                                                           for name in trees},
                                            "median_job_wall_s": median,
                                            "after_over_before": median["after"] / median["before"]}
    record = {"benchmark": "lstm_one_loop", "device": "cpu", "job": SHRUNK, "before_commit": commit.stdout.strip(),
              "same_results": results, "speed": speed,
              "load_average_1_5_15": {"start": load_at_start, "end": os.getloadavg()}}
    write_record(record, args.out)
    print(json.dumps({"same_results": results, "speed": {k: v["after_over_before"] for k, v in speed.items()}},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
