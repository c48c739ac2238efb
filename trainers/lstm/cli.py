"""`trainers lstm train|evaluate|export`. Light: the heavy modules load when a verb runs."""

from __future__ import annotations

import argparse

from trainers.lstm.config import LstmConfig
from trainers.runtime import config as cfgmod
from trainers.runtime.config import number

CONFIG = LstmConfig
HELP = "per-symbol LSTM direction models (seed 003): one model per symbol, many at once on every device"


def _train(args) -> int:
    from trainers.lstm.train import train

    return train(cfgmod.from_args(LstmConfig, args))


def _evaluate(args) -> int:
    from trainers.lstm.evaluate import evaluate_run

    evaluate_run(args.run_dir, args.symbols, args.checkpoint, args.device)
    return 0


def _export(args) -> int:
    from trainers.lstm.export import export_run

    out = export_run(args.run_dir, args.symbols, args.checkpoint, args.tolerance, args.latency_iters, args.force)
    print(f"exported {len(out['exported'])} symbol(s) (current or new), {len(out['not_finished'])} not finished"
          + (f", {len(out['failed'])} failed: {out['failed']}" if out["failed"] else ""))
    return 1 if out["failed"] else 0


def add_verbs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one model per symbol; under torchrun every worker takes symbols from a "
                                     "shared queue; resumes when --run-dir holds a job")
    cfgmod.add_dataclass_args(p, LstmConfig)
    p.set_defaults(func=_train)

    p = sub.add_parser("evaluate", help="evaluate the job's symbols' checkpoints on val and test beside the baselines")
    p.add_argument("--run-dir", required=True, help="the job folder")
    p.add_argument("--symbols", default=None, help="only these (default: every symbol with a checkpoint)")
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("export", help="ONNX per finished symbol (probability out), checked by onnxruntime at "
                                      "other batch sizes")
    p.add_argument("--run-dir", required=True, help="the job folder")
    p.add_argument("--symbols", default=None, help="only these (default: every finished symbol)")
    p.add_argument("--checkpoint", default="best", help="best, latest or a step number (default: best)")
    p.add_argument("--tolerance", type=number(float, gt=0), default=1e-4,
                   help="largest allowed abs difference (default: 1e-4)")
    p.add_argument("--latency-iters", type=number(int, min=1), default=20, help="timed runs per batch size (default: 20)")
    p.add_argument("--force", action="store_true", help="export again even when the export is current")
    p.set_defaults(func=_export)
