"""`trainers <command>`: one entry point per stage, each a short call into the package."""

from __future__ import annotations

import argparse
import json
import os
import sys

from trainers.errors import UsageError
from trainers.runtime import config as cfgmod


def _forecast(args) -> int:
    from trainers.jobs.forecast import ForecastConfig, train

    train(cfgmod.from_args(ForecastConfig, args))
    return 0


def _evaluate(args) -> int:
    from trainers.jobs.forecast import evaluate_run

    evaluate_run(args.run_dir, args.checkpoint, args.device)
    return 0


def _export(args) -> int:
    from trainers.export import ExportMismatch, export_forecast_run

    try:
        info = export_forecast_run(args.run_dir, args.checkpoint, args.tolerance, args.latency_iters)
    except ExportMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    lat = info["latency_cpu"]
    print(f"exported {args.run_dir}/model.onnx (checkpoint step {info['checkpoint_step']}); onnxruntime vs PyTorch "
          f"max abs error {info['parity']['max_abs_error']:.2e} at batch sizes {info['parity']['batch_sizes']}; "
          f"CPU p50 batch 1 {lat['batch_1']['onnxruntime']['p50_ms']:.2f} ms, "
          f"batch 256 {lat['batch_256']['onnxruntime']['p50_ms']:.2f} ms")
    return 0


def _package(args) -> int:
    from trainers.package import package_run

    info = package_run(args.run_dir, args.output)
    print(json.dumps(info))
    return 0


def _fetch(args) -> int:
    from trainers.data.fetch_cli import print_json, run_fetch

    print_json(run_fetch(args))
    return 0


def _refresh_universe(args) -> int:
    from trainers.data.fetch_cli import print_json, run_refresh

    print_json(run_refresh(args))
    return 0


def _preflight(args) -> int:
    from trainers.preflight import main as preflight_main

    return preflight_main(args)


def _gnn_data(args) -> int:
    from trainers.data.graphs import write_dataset

    meta = write_dataset(args.out, args.train, args.val, args.seed, args.min_nodes, args.max_nodes, args.workers,
                         progress=not args.no_progress)
    print(json.dumps({s: {k: v for k, v in m.items() if k in ("graphs", "nodes", "edges")}
                      for s, m in meta["splits"].items()}))
    return 0


def _gnn(args) -> int:
    from trainers.jobs.coloring import ColoringConfig, train

    train(cfgmod.from_args(ColoringConfig, args))
    return 0


def _gnn_export(args) -> int:
    from trainers.export import ExportMismatch
    from trainers.jobs.coloring import export_gnn_run

    try:
        info = export_gnn_run(args.run_dir, args.tolerance)
    except ExportMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"exported {args.run_dir}/model.onnx; onnxruntime vs PyTorch max abs error {info['max_abs_error']:.2e} "
          f"on graphs of {', '.join(info['checked'])}")
    return 0


def _color(args) -> int:
    from trainers.onnx_color import colour_file

    print(json.dumps(colour_file(args.model, args.graph, args.output, args.seed)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from trainers.jobs.forecast import ForecastConfig

    parser = argparse.ArgumentParser(prog="trainers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    p = sub.add_parser("forecast", help="train the return forecaster (run it under torchrun for several workers)")
    cfgmod.add_dataclass_args(p, ForecastConfig)
    p.set_defaults(func=_forecast)

    from trainers.data.fetch_cli import add_fetch_args, add_refresh_args
    from trainers.preflight import add_args as add_preflight_args

    p = sub.add_parser("preflight", help="check GPUs, driver, NCCL bandwidth, /dev/shm, disk and memory")
    add_preflight_args(p)
    p.set_defaults(func=_preflight)

    p = sub.add_parser("fetch-sp500", help="fill the price cache: yfinance (resumable), a synthetic stand-in or a file")
    add_fetch_args(p)
    p.set_defaults(func=_fetch)

    p = sub.add_parser("refresh-universe", help="re-read the S&P 500 constituents (needs network)")
    add_refresh_args(p)
    p.set_defaults(func=_refresh_universe)

    from trainers.jobs.coloring import ColoringConfig

    p = sub.add_parser("gnn-data", help="generate the graph dataset (train/val) for the colouring GNN")
    p.add_argument("--out", default="data/graphs", help="dataset folder (default: data/graphs)")
    p.add_argument("--train", type=int, default=2000, help="training graphs (default: 2000)")
    p.add_argument("--val", type=int, default=200, help="validation graphs (default: 200)")
    p.add_argument("--min-nodes", type=int, default=20, help="smallest graph (default: 20)")
    p.add_argument("--max-nodes", type=int, default=300, help="largest graph (default: 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="generator processes")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_gnn_data)

    p = sub.add_parser("gnn", help="train the graph-colouring GNN (run it under torchrun for several workers)")
    cfgmod.add_dataclass_args(p, ColoringConfig)
    p.set_defaults(func=_gnn)

    p = sub.add_parser("gnn-export", help="export the colouring GNN to ONNX, checked on graphs of other sizes")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.set_defaults(func=_gnn_export)

    p = sub.add_parser("color", help="colour a graph file (DIMACS .col or edge list) with an exported GNN + repair")
    p.add_argument("--model", required=True, help="model.onnx from gnn-export (export.json beside it)")
    p.add_argument("--graph", required=True, help="DIMACS .col (1-based) or edge list 'u v' (0-based)")
    p.add_argument("--output", default=None, help="write 'node colour' lines here")
    p.add_argument("--seed", type=int, default=0, help="seed of the random node features")
    p.set_defaults(func=_color)

    p = sub.add_parser("evaluate", help="evaluate a run's checkpoint against the baselines on val and test")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("export", help="export ONNX and prove onnxruntime matches PyTorch")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed abs difference (default: 1e-4)")
    p.add_argument("--latency-iters", type=int, default=50, help="timed runs per batch size (default: 50)")
    p.set_defaults(func=_export)

    p = sub.add_parser("package", help="tarball of the run with SHA256SUMS")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--output", default=None, help="tarball path (default: <run-dir>.tar.gz beside the run)")
    p.set_defaults(func=_package)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return UsageError.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
