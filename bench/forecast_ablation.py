"""Benchmark: why the Transformer lost to ridge on the demo market, and which model options the
defaults take. Each row is the README's demo command (`torchrun --standalone --nproc_per_node=2 -m
trainers forecast train`, every default) with the row's flags, every model option spelled out so a
row means the same whatever the defaults are; the baselines (ridge, LightGBM, persistence) are the
same in every row (they do not depend on the model), the ensemble is each row's own.

    python bench/forecast_ablation.py --out bench/results/forecast_ablation_cpu.json

Recorded per row and split (validation, test): Rank IC (mean, t_nw), the model's Rank IC minus
ridge's and persistence's date by date with its Newey-West standard error, the long-short return
after costs, the verdict, and the wall time. The defaults are chosen by `choose` from the
validation figures alone (the rule is in code, written before the rows ran); the test figures are
recorded for the report, never read by the choice. The small preset is a row, not a candidate: the
default preset stays the one a CPU demo trains in minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forecast_runs import cores, demo_command, figures, run_demo  # noqa: E402
from record import write_record  # noqa: E402

BEFORE = ["--readout", "last", "--no-linear-skip", "--no-past-returns", "--encoder", "transformer"]
BOTH = ["--readout", "last", "--linear-skip", "--past-returns", "--encoder", "transformer"]
# key -> (what the row is, its flags, a candidate for the defaults?). Keys are plain words (the
# READMEs cite figures by dotted paths into the JSON). The first rows take the 89e0c69 model apart;
# the readout, learning-rate, epoch and preset rows vary one thing of the Transformer with both inputs.
ROWS: dict[str, tuple[str, list[str], bool]] = {
    "before": ("Transformer as at 89e0c69", BEFORE, True),
    "skip": ("+ linear skip", ["--readout", "last", "--linear-skip", "--no-past-returns", "--encoder", "transformer"],
             True),
    "past_returns": ("+ past returns", ["--readout", "last", "--no-linear-skip", "--past-returns", "--encoder",
                                        "transformer"], True),
    "skip_past_returns": ("+ linear skip + past returns", BOTH, True),
    "linear_alone": ("linear skip alone (no Transformer)", ["--no-past-returns", "--linear-skip", "--encoder", "none"],
                     False),
    "linear_alone_past_returns": ("linear skip alone, past returns", ["--past-returns", "--linear-skip", "--encoder",
                                                                      "none"], False),
    "readout_mean": ("readout mean", ["--readout", "mean", *BOTH[2:]], True),
    "readout_attention": ("readout attention", ["--readout", "attention", *BOTH[2:]], True),
    "lr_3e-4": ("LR 3e-4", [*BOTH, "--lr", "3e-4"], True),
    "lr_3e-3": ("LR 3e-3", [*BOTH, "--lr", "3e-3"], True),
    "epochs_2": ("2 epochs", [*BOTH, "--epochs", "2"], True),
    "epochs_8": ("8 epochs", [*BOTH, "--epochs", "8"], True),
    # not a candidate: the default preset is the one a CPU demo trains in minutes
    "preset_small": ("preset small", [*BOTH, "--preset", "small"], False),
}


def choose(rows: dict) -> tuple[str, str]:
    """The defaults: the candidate row with the highest validation Rank IC (validation only), with
    the runner-up and how far behind it is in the winner's standard errors (one seed a row: a gap
    under one se is not a finding)."""
    ranked = sorted((n for n in rows if rows[n]["candidate"]), key=lambda n: -rows[n]["val"]["model"]["rank_ic"])
    best = rows[ranked[0]]["val"]["model"]
    se = best["rank_ic"] / best["rank_ic_t_nw"]
    why = f"highest validation Rank IC {best['rank_ic']:+.4f} (se {se:.4f})"
    if len(ranked) > 1:
        second = rows[ranked[1]]["val"]["model"]["rank_ic"]
        why += f"; runner-up {ranked[1]} {second:+.4f}, {(best['rank_ic'] - second) / se:.1f} se behind"
    return ranked[0], why


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=None, help=f"comma-separated row keys, from {', '.join(ROWS)} (default: all)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    names = list(ROWS) if args.rows is None else [n.strip() for n in args.rows.split(",")]
    rows, baselines, started = {}, None, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            label, flags, candidate = ROWS[name]
            r, wall = run_demo(flags, Path(tmp) / f"row{i}", args.nproc)
            e = r["evaluation"]
            rows[name] = {"label": label, "flags": flags, "candidate": candidate,
                          "command": demo_command(flags, args.nproc),
                          "wall_s": wall, "parameters": r["model"]["parameters"], "steps": r["training"]["steps"],
                          "best_step": r["training"]["best_val"]["step"],
                          **{split: {"model": figures(e[split], "model"), "ensemble": figures(e[split], "ensemble")}
                             for split in ("val", "test")}}
            if baselines is None:
                baselines = {split: {n: figures(e[split], n) for n in ("ridge", "lightgbm", "persistence")}
                             for split in ("val", "test")}
                baselines["anchor_dates"] = r["data"]["anchor_dates"]
                baselines["source"] = r["data"]["source"]
            print(json.dumps({name: {"wall_s": round(wall, 1), "val_rank_ic": rows[name]["val"]["model"]["rank_ic"]}}),
                  flush=True)
            # rewritten after every row (complete: false until the last), so a cut-off run keeps its rows
            record(rows, baselines, started, args, complete=i == len(names) - 1)
    return 0


def record(rows: dict, baselines: dict | None, started: float, args, complete: bool) -> None:
    chosen, why = choose(rows) if any(row["candidate"] for row in rows.values()) else (None, None)
    write_record({"benchmark": "forecast_ablation", "device": "cpu", "world_size": args.nproc, "synthetic": True,
                  "cores": cores(), "complete": complete, "rows": rows, "baselines": baselines, "chosen": chosen,
                  "chosen_because": why, "wall_s_total": time.perf_counter() - started}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
