"""`trainers ppo train|evaluate|export`. Light: the heavy modules load when a verb runs."""

from __future__ import annotations

import argparse

from trainers.ppo.config import PpoConfig
from trainers.runtime import config as cfgmod
from trainers.runtime.config import number

CONFIG = PpoConfig
HELP = "the CLSTM-PPO trading agent (seed 001): vectorised portfolio environments, PPO, backtest vs buy-and-hold"


def _train(args) -> int:
    from trainers.ppo.train import train

    train(cfgmod.from_args(PpoConfig, args))
    return 0


def _evaluate(args) -> int:
    from trainers.ppo.evaluate import evaluate_run

    evaluate_run(args.run_dir, args.checkpoint, args.device)
    return 0


def _export(args) -> int:
    from trainers.onnx import parity_line
    from trainers.ppo.export import export_run

    info = export_run(args.run_dir, args.checkpoint, args.tolerance, args.latency_iters)
    print(f"exported {args.run_dir}/model.onnx ({info['agent']}, update {info['selected_update']}); "
          f"{parity_line(info['parity'], info['latency_cpu'])}")
    return 0


def add_verbs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train; under torchrun for several workers; resumes when --run-dir holds a run")
    cfgmod.add_dataclass_args(p, PpoConfig)
    p.set_defaults(func=_train)

    p = sub.add_parser("evaluate", help="backtest a run's agents (chosen on validation) and baselines on the test period")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="latest", help="latest or a step number (default: latest)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("export", help="export the chosen agent's deterministic policy to ONNX, checked by onnxruntime")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--checkpoint", default="latest", help="latest or a step number (default: latest)")
    p.add_argument("--tolerance", type=number(float, gt=0), default=1e-4,
                   help="largest allowed abs difference (default: 1e-4)")
    p.add_argument("--latency-iters", type=number(int, min=1), default=50, help="timed runs per batch size (default: 50)")
    p.set_defaults(func=_export)
