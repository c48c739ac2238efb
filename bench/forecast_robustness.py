"""Benchmark: the forecaster's defaults judged on markets they were not chosen on. Each market is the
README's demo command (`torchrun --standalone --nproc_per_node=2 -m trainers forecast train`,
every default) with the market's flags:

    momentum 0.04, seed 1   a weaker planted effect on another draw of the market
    momentum 0.08, seed 2   the demo's strength on another draw
    momentum 0.12, seed 3   a stronger one
    regime 0.08             momentum that reverses in a stock's most turbulent 30 % of days (a
                            product of two inputs no linear model can express; tests/forecast/
                            test_forecast_markets.py shows a linear fit of its true inputs stays
                            far below the oracle)
    regime 0.08, seed 5     the same on another draw
    control                 no effect at all: "no skill detected" is the right answer
    walk-forward            the demo market in 3 expanding-window folds (--walk-forward 3)

    python bench/forecast_robustness.py --out bench/results/forecast_robustness_cpu.json

Recorded per market and split: every forecast's Rank IC, t_nw and long-short after costs (the
model, ridge, LightGBM, persistence, the ensemble), the model's Rank IC minus each other forecast's
date by date with its Newey-West standard error, the verdict, and the wall time; for the
walk-forward, each fold's test figures and their mean and std.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forecast_runs import cores, demo_command, run_demo, split_table  # noqa: E402
from record import write_record  # noqa: E402

# key -> (what the market is, its flags), the most telling first; keys are plain words (READMEs cite
# figures by dotted paths)
MARKETS: dict[str, tuple[str, list[str]]] = {
    "regime_008": ("regime 0.08", ["--synthetic-effect", "regime", "--synthetic-momentum", "0.08"]),
    "control": ("control (momentum 0)", ["--synthetic-momentum", "0"]),
    "momentum_004_seed1": ("momentum 0.04, seed 1", ["--data-seed", "1", "--synthetic-momentum", "0.04"]),
    "momentum_008_seed2": ("momentum 0.08, seed 2", ["--data-seed", "2", "--synthetic-momentum", "0.08"]),
    "momentum_012_seed3": ("momentum 0.12, seed 3", ["--data-seed", "3", "--synthetic-momentum", "0.12"]),
    "walk_forward": ("walk-forward, 3 folds of the demo market", ["--walk-forward", "3"]),
    "regime_008_seed5": ("regime 0.08, seed 5", ["--synthetic-effect", "regime", "--synthetic-momentum", "0.08",
                                                 "--data-seed", "5"]),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--markets", default=None, help=f"comma-separated keys, from {', '.join(MARKETS)} (default: all)")
    p.add_argument("--extra", default="", help="flags added to every market's command (e.g. to judge other options)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    names = list(MARKETS) if args.markets is None else [n.strip() for n in args.markets.split(",")]
    extra = args.extra.split()
    markets = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            label, flags = MARKETS[name]
            flags = [*flags, *extra]
            run_dir = Path(tmp) / f"m{i}"
            r, wall = run_demo(flags, run_dir, args.nproc)
            row = {"label": label, "flags": flags, "command": demo_command(flags, args.nproc), "wall_s": wall,
                   "source": r["data"]["source"]}
            if "walk_forward" in r:
                wf = r["walk_forward"]
                row["walk_forward"] = {"per_fold": {str(f["fold"]): f for f in wf["per_fold"]},
                                       "mean_std": wf["mean_std"], "skill_folds": wf["skill_folds"]}
                row["folds"] = {}
                for k in range(wf["folds"]):
                    fold = json.loads((run_dir / f"fold_{k}" / "results.json").read_text())
                    row["folds"][str(k)] = {"anchor_dates": fold["data"]["anchor_dates"],
                                            **{s: split_table(fold["evaluation"][s]) for s in ("val", "test")}}
            else:
                e = r["evaluation"]
                row.update({"anchor_dates": r["data"]["anchor_dates"], "steps": r["training"]["steps"],
                            **{s: split_table(e[s]) for s in ("val", "test")}})
            markets[name] = row
            brief = {s: row[s]["model"]["rank_ic"] for s in ("val", "test") if s in row}
            print(json.dumps({name: {"wall_s": round(wall, 1), "model_rank_ic": brief}}), flush=True)
            # rewritten after every market (complete: false until the last), so a cut-off run keeps its rows
            write_record({"benchmark": "forecast_robustness", "device": "cpu", "world_size": args.nproc,
                          "synthetic": True, "cores": cores(), "complete": i == len(names) - 1, "extra_flags": extra,
                          "markets": markets}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
