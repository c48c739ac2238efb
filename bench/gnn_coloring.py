"""Benchmark: the colouring GNN against its peers, graph by graph, at a matched time budget.

Trains with the kit's own commands (or reuses --run-dir), exports ONNX, then colours every
instance with `trainers gnn color`'s code path (onnxruntime, one thread) and reports, per graph:

- GNN stages: raw argmax (colours / conflicting edges), repaired, scheduled, searched (tabu search
  with --budget seconds), and fine-tuned on the instance (PI-GNN style; extra time, reported apart);
- networkx greedy largest-first and smallest-last, and DSATUR;
- TabuCol from `gcol` (Lewis; opt_alg=2, DSATUR start) at the same time as the GNN's searched stage:
  gcol counts iterations, not seconds, so it runs with it_limit = 1000, 2000, 4000, ... (same seed:
  each run's trajectory extends the one before) and the largest whose time fits the GNN's is kept;
- our TabuCol from DSATUR's colouring with the same budget: what the GNN's start is worth;
- the known chromatic number (queen, Mycielski), or the planted bound.

Goals (issue 16), judged per graph: never more colours than DSATUR; the known chi on queen5_5..8_8
and myciel3..6; within one colour of gcol's TabuCol at an equal time on the random graphs.

    pip install gcol   # benchmark-only dependency, never needed by the kit or its tests
    OMP_NUM_THREADS=1 python bench/gnn_coloring.py --nproc 2 --train 4000 --val 100 --max-nodes 150 \\
        --epochs 15 --budget 5 --out bench/results/gnn_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.gnn.color import color_file  # noqa: E402
from trainers.gnn.decode import classical  # noqa: E402
from trainers.gnn.graphs import Graph, benchmark_set, erdos_renyi, mycielski, read_graph, write_dimacs  # noqa: E402
from trainers.gnn.search import reduce_colors  # noqa: E402

RANDOM = [(125, 0.1), (125, 0.5), (125, 0.9), (250, 0.1), (250, 0.5), (500, 0.1)]  # DSJC-like G(n, p)


def instances(benchmark_dir: str | None) -> list[tuple[str, Graph]]:
    out = [("benchmark", g) for g in benchmark_set()] + [("known chi", mycielski(3))]
    rng = np.random.default_rng(2024)
    out += [("random", erdos_renyi(n, p, rng, f"gnp_{n}_{p}")) for n, p in RANDOM]
    if benchmark_dir:
        out += [("dimacs", read_graph(p)) for p in sorted(Path(benchmark_dir).glob("*.col"))]
    return out


def to_nx(g: Graph):
    import networkx as nx

    G = nx.Graph()
    G.add_nodes_from(range(g.n))
    G.add_edges_from(g.edges.tolist())
    return G


def gcol_tabucol(g: Graph, seconds: float, seed: int) -> dict:
    """gcol's TabuCol at the largest it_limit (1000 x 2^j) that finishes within `seconds`."""
    import gcol
    import networkx as nx

    G, best, it_limit = to_nx(g), None, 1000
    target = nx.approximation.large_clique_size(G) if g.n_edges else 1  # where gcol itself stops
    while True:
        random.seed(seed)
        t0 = time.perf_counter()
        coloring = gcol.node_coloring(G, strategy="dsatur", opt_alg=2, it_limit=it_limit)
        dt = time.perf_counter() - t0
        if best is not None and dt > seconds:
            return best
        best = {"colors": max(coloring.values()) + 1 if coloring else 0, "seconds": dt, "it_limit": it_limit}
        if dt > seconds or best["colors"] <= target:
            return best  # even the smallest run took longer (reported with its time), or nothing left to gain
        it_limit *= 2


def dsatur_coloring(g: Graph) -> np.ndarray:
    import networkx as nx

    col = nx.greedy_color(to_nx(g), strategy="saturation_largest_first")
    return np.array([col[v] for v in range(g.n)], dtype=np.int64)


def train(args, work: Path) -> Path:
    data, run = work / "data", work / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    commands = [
        [sys.executable, "-m", "trainers", "gnn", "data", "--out", str(data), "--train", str(args.train), "--val",
         str(args.val), "--max-nodes", str(args.max_nodes), "--no-progress"],
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", "-m",
         "trainers", "gnn", "train", "--data-dir", str(data), "--run-dir", str(run), "--epochs", str(args.epochs),
         "--nodes-per-batch", str(args.nodes_per_batch), "--search-iters", "20000", "--search-seconds", "1"],
        [sys.executable, "-m", "trainers", "gnn", "export", "--run-dir", str(run)],
    ]
    for cmd in commands:
        subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return run


def goals(kind: str, g: Graph, row: dict) -> dict:
    final = row["gnn"]["searched"]
    out = {"not_above_dsatur": final <= row["dsatur"]["colors"]}
    if g.chromatic is not None and (g.name.startswith("queen") or g.name.startswith("myciel")):
        out["known_chi"] = final == g.chromatic
    if kind == "random":
        out["within_one_of_tabucol"] = final <= row["gcol_tabucol"]["colors"] + 1
    return out


def color_one(kind: str, g: Graph, model: Path, work: Path, args) -> dict:
    path = work / f"{g.name}.col"
    write_dimacs(g, path)
    plain = color_file(str(model), str(path), seed=args.seed, search_iters=10**9, search_seconds=args.budget)
    tuned = color_file(str(model), str(path), seed=args.seed, search_iters=10**9, search_seconds=args.budget,
                       finetune_steps=args.finetune_steps, finetune_restarts=args.finetune_restarts)
    gnn_seconds = plain["seconds"]["total"]
    c = classical(g)
    from_dsatur = reduce_colors(g, dsatur_coloring(g), iters=10**9, seconds=args.budget, seed=args.seed)
    row = {"kind": kind, "graph": g.name, "nodes": g.n, "edges": g.n_edges, "chromatic": g.chromatic,
           "planted_bound": g.upper_k, "clique_bound": plain["lower_bound"],
           "gnn": {"raw_colors": plain["raw"]["colors"], "raw_conflicts": plain["raw"]["conflicts"],
                   "repaired": plain["repaired"]["colors"], "scheduled": plain["scheduled"]["colors"],
                   "searched": plain["colors"], "seconds": gnn_seconds, "stage_seconds": plain["seconds"],
                   "search_stopped": plain["searched"]["stopped"],
                   "finetuned": tuned["colors"], "finetuned_seconds": tuned["seconds"]["total"],
                   "finetune": tuned.get("finetuned")},
           "greedy_largest_first": c["greedy_largest_first"], "greedy_smallest_last": c["greedy_smallest_last"],
           "dsatur": c["dsatur"], "gcol_tabucol": gcol_tabucol(g, gnn_seconds, args.seed),
           "tabucol_from_dsatur": {"colors": from_dsatur.colors, "seconds": from_dsatur.seconds}}
    row["goals"] = goals(kind, g, row)
    return row


def batch_assembly(data_dir: Path, nodes_per_batch: int, steps: int = 30) -> dict:
    """Milliseconds to build one training step's inputs (about nodes_per_batch nodes) on the CPU:
    the old way (graph by graph in Python, the greedy bound recomputed for each graph) against
    gathering from the split held in memory by offsets (what training does now, on its device)."""
    import torch

    from trainers.gnn.batch import DeviceGraphs, make_batch
    from trainers.gnn.graphs import GraphSplit
    from trainers.gnn.sampling import NodeBudgetPlan

    split = GraphSplit(data_dir, "train")
    plan = NodeBudgetPlan(split.nodes, 1, 0, nodes_per_batch, seed=0, epoch=0)
    batches = [plan.batch(s) for s in range(min(steps, plan.steps))]
    cpu = torch.device("cpu")
    held = DeviceGraphs(split, 16, 8, cpu)
    gen = torch.Generator().manual_seed(0)
    timings = {}
    for name, build in (("graph_by_graph_ms", lambda b: make_batch([split[i] for i in b], 16, 8, list(b), cpu)),
                        ("gather_by_offsets_ms", lambda b: held.batch(b, gen))):
        t0 = time.perf_counter()
        for b in batches:
            build(b)
        timings[name] = 1000 * (time.perf_counter() - t0) / len(batches)
    return {"nodes_per_batch": nodes_per_batch, "batches": len(batches),
            "graphs_per_batch": float(np.mean([len(b) for b in batches])), **timings}


def known(r: dict) -> str:
    return str(r["chromatic"]) if r["chromatic"] else (f"<= {r['planted_bound']}" if r["planted_bound"] else "?")


def markdown(rows: list[dict], budget: float) -> str:
    lines = ["| graph | n | m | chi | GNN raw (colours / conflicts) | repaired | scheduled | **searched** | GNN s | "
             f"fine-tuned (s) | greedy LF | greedy SL | DSATUR | gcol TabuCol (s) | our TabuCol from DSATUR ({budget:g} s) "
             "| goals |", "|" + " --- |" * 16]
    for r in rows:
        gn = r["gnn"]
        met = ", ".join(f"{k} {'yes' if v else '**no**'}" for k, v in r["goals"].items())
        lines.append(f"| {r['graph']} | {r['nodes']} | {r['edges']} | {known(r)} | {gn['raw_colors']} / "
                     f"{gn['raw_conflicts']} | {gn['repaired']} | {gn['scheduled']} | **{gn['searched']}** | "
                     f"{gn['seconds']:.2f} | {gn['finetuned']} ({gn['finetuned_seconds']:.1f}) | "
                     f"{r['greedy_largest_first']['colors']} | {r['greedy_smallest_last']['colors']} | "
                     f"{r['dsatur']['colors']} | {r['gcol_tabucol']['colors']} ({r['gcol_tabucol']['seconds']:.2f}) | "
                     f"{r['tabucol_from_dsatur']['colors']} | {met} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--val", type=int, default=100)
    p.add_argument("--max-nodes", type=int, default=150)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--nodes-per-batch", type=int, default=4096)
    p.add_argument("--run-dir", default=None, help="a trained and exported run to reuse (skips training)")
    p.add_argument("--budget", type=float, default=5.0, help="search seconds per graph (GNN); gcol gets the GNN's time")
    p.add_argument("--finetune-steps", type=int, default=200)
    p.add_argument("--finetune-restarts", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--benchmark-dir", default=None, help="also colour every DIMACS .col file in this folder")
    p.add_argument("--only", default=None, help="comma-separated graph names (a quick look)")
    p.add_argument("--out", default=None)
    p.add_argument("--markdown", default=None, help="also write the table here")
    args = p.parse_args()
    try:
        import gcol  # noqa: F401
    except ImportError:
        raise SystemExit("this benchmark compares with gcol's TabuCol: pip install gcol (benchmark-only)") from None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        run = Path(args.run_dir) if args.run_dir else train(args, work)
        train_wall = time.perf_counter() - t0
        results = json.loads((run / "results.json").read_text())
        assembly = batch_assembly(Path(results["data"]["data_dir"]), results["config"]["nodes_per_batch"])
        rows = []
        for kind, g in instances(args.benchmark_dir):
            if args.only and g.name not in args.only.split(","):
                continue
            rows.append(color_one(kind, g, run / "model.onnx", work, args))
            print(json.dumps({k: rows[-1][k] for k in ("graph", "gnn", "dsatur", "gcol_tabucol", "goals")}),
                  flush=True)
    t = results["training"]
    record = {"benchmark": "gnn_coloring", "device": t["device_name"], "world_size": t["world_size"],
              "train": {"graphs": results["data"]["train_graphs"], "nodes": results["data"].get("train_nodes"),
                        "epochs": results["config"]["epochs"], "steps": t["steps"],
                        "nodes_per_batch": results["config"].get("nodes_per_batch"),
                        "graphs_per_s_per_device": t["throughput"]["per_s_per_device"],
                        "nodes_per_s_per_device": t.get("nodes_per_s_per_device"),
                        "effective_graphs_per_s": t["throughput"]["effective_per_s"],
                        "wall_s": train_wall if not args.run_dir else None,
                        "best_val_conflict_fraction": t["best_val"]["value"]},
              "batch_assembly_cpu": assembly, "model": results["model"], "budget_s": args.budget,
              "finetune": {"steps": args.finetune_steps, "restarts": args.finetune_restarts},
              "threads": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "onnxruntime_intra_op": 1},
              "graphs": rows,
              "goals_missed": [f"{r['graph']}: {k}" for r in rows for k, v in r["goals"].items() if not v]}
    write_record(record, args.out)
    table = markdown(rows, args.budget)
    if args.markdown:
        Path(args.markdown).write_text(table)
    print(table)
    print("goals missed:", record["goals_missed"] or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
