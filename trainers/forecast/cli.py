"""`trainers forecast train|evaluate|export`. Light: the heavy modules load when a verb runs."""

from __future__ import annotations

import argparse

from trainers.forecast.config import ForecastConfig
from trainers.runtime import config as cfgmod
from trainers.runtime.config import number

CONFIG = ForecastConfig
HELP = "the S&P 500 return forecaster (seed 000): a Transformer over windows of daily features"


def _train(args) -> int:
    from trainers.forecast.train import train

    train(cfgmod.from_args(ForecastConfig, args))
    return 0


def _evaluate(args) -> int:
    from trainers.forecast.evaluate import evaluate_run

    evaluate_run(args.run_dir, args.checkpoint, args.device, args.top_k, args.cost_bps)
    return 0


def _export(args) -> int:
    from trainers.forecast.export import export_run
    from trainers.onnx import parity_line

    info = export_run(args.run_dir, args.checkpoint, args.tolerance, args.latency_iters)
    print(f"exported {args.run_dir}/model.onnx (checkpoint step {info['checkpoint_step']}); "
          f"{parity_line(info['parity'], info['latency_cpu'])}")
    return 0


def add_verbs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train; under torchrun for several workers; resumes when --run-dir holds a run")
    cfgmod.add_dataclass_args(p, ForecastConfig)
    p.set_defaults(func=_train)

    p = sub.add_parser("evaluate", help="evaluate a run's checkpoint against the baselines on val and test; "
                                        "rewrites results.json's evaluation, report.md and the pictures")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--top-k", type=number(int, min=1), default=None,
                   help="names held long (and short) by the portfolios (default: the run's --top-k)")
    p.add_argument("--cost-bps", type=number(float, min=0, max=10000), default=None,
                   help="trading cost in basis points of the notional traded (default: the run's --cost-bps)")
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("export", help="export ONNX and prove onnxruntime matches PyTorch at other batch sizes")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")
    p.add_argument("--tolerance", type=number(float, gt=0), default=1e-4,
                   help="largest allowed abs difference (default: 1e-4)")
    p.add_argument("--latency-iters", type=number(int, min=1), default=50, help="timed runs per batch size (default: 50)")
    p.set_defaults(func=_export)
