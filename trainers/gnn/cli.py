"""`trainers gnn data|train|export|color`. Light: the heavy modules load when a verb runs, and
`color` needs only NumPy and onnxruntime (no torch)."""

from __future__ import annotations

import argparse
import json
import os

from trainers.gnn.config import MAX_GENERATED_NODES, GnnConfig
from trainers.runtime import config as cfgmod
from trainers.runtime.config import number

CONFIG = GnnConfig
CPUS = os.cpu_count() or 1
HELP = "the graph-coloring GNN (seed 002): Potts loss, repair, tabu search, ONNX; colors DIMACS graphs"


def _data(args) -> int:
    from trainers.gnn.graphs import write_dataset

    meta = write_dataset(args.out, args.train, args.val, args.seed, args.min_nodes, args.max_nodes, args.workers,
                         progress=not args.no_progress, overwrite=args.overwrite, dense=args.dense)
    print(json.dumps({s: {k: v for k, v in m.items() if k in ("graphs", "nodes", "edges")}
                      for s, m in meta["splits"].items()}))
    return 0


def _train(args) -> int:
    from trainers.gnn.train import train

    train(cfgmod.from_args(GnnConfig, args))
    return 0


def _export(args) -> int:
    from trainers.gnn.export import export_run

    info = export_run(args.run_dir, args.checkpoint, args.tolerance)
    print(f"exported {args.run_dir}/model.onnx; onnxruntime vs PyTorch max abs error {info['max_abs_error']:.2e} "
          f"on graphs of {', '.join(info['checked'])}")
    return 0


def _evaluate(args) -> int:
    from trainers.gnn.evaluate import evaluate_run

    evaluation = evaluate_run(args.run_dir, args.checkpoint, args.device)
    print(json.dumps({"checkpoint_step": evaluation["checkpoint_step"], "val": evaluation["val"]}))
    return 0


def _color(args) -> int:
    from trainers.gnn.color import Search, color_file

    search = Search(args.search, args.search_iters, args.search_seconds, args.population, args.device, args.seed_from,
                    args.finetune_steps, args.finetune_restarts)
    print(json.dumps(color_file(args.model, args.graph, args.output, args.seed, search)))
    return 0


def add_verbs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="generate the graph dataset (train/val)")
    p.add_argument("--out", default="data/graphs", help="dataset folder (default: data/graphs)")
    p.add_argument("--train", type=number(int, min=1), default=2000, help="training graphs (default: 2000)")
    p.add_argument("--val", type=number(int, min=1), default=200, help="validation graphs (default: 200)")
    p.add_argument("--min-nodes", type=number(int, min=2, max=MAX_GENERATED_NODES), default=20,
                   help="smallest graph (default: 20)")
    p.add_argument("--max-nodes", type=number(int, min=2, max=MAX_GENERATED_NODES), default=300,
                   help=f"largest graph (default: 300; at most {MAX_GENERATED_NODES:,}: the generators draw from "
                        f"all n^2/2 node pairs)")
    p.add_argument("--dense", type=number(float, min=0, max=1), default=0.0,
                   help="share of graphs from the dense families (G(n, p) with p in 0.1..0.9, planted flat graphs "
                        "with up to 40 classes): what a model needs to seed the search on hard graphs (default: 0)")
    p.add_argument("--seed", type=number(int, min=0), default=0)
    # the pool starts every process at once: a count beyond the CPUs only costs memory (10**20 crashed)
    p.add_argument("--workers", type=number(int, min=1, max=CPUS), default=max(1, CPUS - 1),
                   help=f"generator processes (at most this machine's {CPUS} CPUs)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset already in --out (runs that trained on it will refuse to resume)")
    p.set_defaults(func=_data)

    p = sub.add_parser("train", help="train; under torchrun for several workers; resumes when --run-dir holds a run")
    cfgmod.add_dataclass_args(p, GnnConfig)
    p.set_defaults(func=_train)

    p = sub.add_parser("evaluate", help="the final evaluation of a run's checkpoint (e.g. after it was stopped)")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("export", help="export ONNX, checked by onnxruntime on graphs of other sizes")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")
    p.add_argument("--tolerance", type=number(float, gt=0), default=1e-4, help="largest allowed abs difference")
    p.set_defaults(func=_export)

    p = sub.add_parser("color", help="color a graph file (DIMACS .col or edge list): exported model, repair, "
                                     "tabu search; optionally fine-tuned on the graph first")
    p.add_argument("--model", required=True, help="model.onnx from `trainers gnn export` (export.json beside it)")
    p.add_argument("--graph", required=True, help="DIMACS .col (1-based) or edge list 'u v' (0-based)")
    p.add_argument("--output", default=None, help="write 'node color' lines here")
    p.add_argument("--seed", type=number(int, min=0), default=0,
                   help="seed of the random node features and of the search (the same seed, the same colouring "
                        "when --search-iters rather than --search-seconds ends the search)")
    p.add_argument("--search", choices=("tabu", "population"), default="tabu",
                   help="tabu: TabuCol from the model's colouring (NumPy; default); population: the population "
                        "search (GPX + batched TabuCol, torch on --device), seeded by colourings sampled from the model")
    p.add_argument("--search-iters", type=number(int, min=0), default=None,
                   help="search iterations in all, moves summed over the population for --search population (0: no "
                        "search; default: 2000000 for tabu, no limit for population)")
    p.add_argument("--search-seconds", type=number(float, gt=0), default=10.0,
                   help="search seconds at most (default: 10; it stops sooner at the clique lower bound)")
    p.add_argument("--population", type=number(int, min=2, max=4096), default=32,
                   help="--search population: colourings improved at once (default: 32)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="--search population: where its tensors live (default: cpu)")
    p.add_argument("--seed-from", choices=("gnn", "dsatur"), default="gnn",
                   help="--search population: the first colourings sampled from the model (gnn; default) or "
                        "randomised DSATUR")
    p.add_argument("--finetune-steps", type=number(int, min=0), default=0,
                   help="fine-tune the model on this graph for this many steps per restart, then repair + search "
                        "again (needs torch and the run's checkpoints beside --model; default: 0, off)")
    p.add_argument("--finetune-restarts", type=number(int, min=1), default=3,
                   help="fine-tuning restarts, each from different random node features (default: 3)")
    p.set_defaults(func=_color)
