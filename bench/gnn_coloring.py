"""Benchmark: the coloring GNN — training graphs/s, and colors and time on the benchmark set vs
networkx's DSATUR — by running the kit's own commands.

    python bench/gnn_coloring.py --nproc 2 --train 1000 --val 100 --max-nodes 150 --epochs 15 \
        --out bench/results/gnn_cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--train", type=int, default=1000)
    p.add_argument("--val", type=int, default=100)
    p.add_argument("--max-nodes", type=int, default=150)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data, run = Path(tmp) / "data", Path(tmp) / "run"
        commands = [
            [sys.executable, "-m", "trainers", "gnn", "data", "--out", str(data), "--train", str(args.train), "--val",
             str(args.val), "--max-nodes", str(args.max_nodes), "--no-progress"],
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", "-m",
             "trainers", "gnn", "train", "--data-dir", str(data), "--run-dir", str(run), "--epochs", str(args.epochs)],
        ]
        for cmd in commands:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        results = json.loads((run / "results.json").read_text())
    t = results["training"]
    rows = [{"graph": r["name"], "nodes": r["nodes"], "edges": r["edges"], "chromatic": r["chromatic"],
             "upper_k": r["upper_k"], "gnn_colors": r["colors"], "gnn_conflicts_before_repair": r["conflicts_before"],
             "gnn_seconds": r["total_s"], "dsatur_colors": r["classical"]["dsatur"]["colors"],
             "dsatur_seconds": r["classical"]["dsatur"]["seconds"]} for r in results["evaluation"]["benchmark"]]
    record = {"benchmark": "gnn_coloring", "device": t["device_name"], "world_size": t["world_size"],
              "train_graphs": args.train, "epochs": args.epochs, "steps": t["steps"],
              "graphs_per_s_global": t["throughput"]["per_s_steady"], "train_seconds": t["elapsed_s_all_attempts"],
              "best_val_conflict_fraction": t["best_val"]["value"], "validation": results["evaluation"]["val"],
              "benchmark_set": rows,
              "totals": {"gnn_seconds": sum(r["gnn_seconds"] for r in rows),
                         "dsatur_seconds": sum(r["dsatur_seconds"] for r in rows),
                         "gnn_colors": sum(r["gnn_colors"] for r in rows),
                         "dsatur_colors": sum(r["dsatur_colors"] for r in rows)}}
    write_record(record, args.out)
    print(json.dumps({k: record[k] for k in ("graphs_per_s_global", "totals", "validation")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
