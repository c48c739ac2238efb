"""Benchmark: ONNX Runtime vs PyTorch eager latency on CPU, batch 1 and 256, per preset.

    python bench/inference.py --presets tiny,small --iters 50 --out bench/results/inference_cpu.json

Uses the same export and check as `trainers forecast export` (a randomly initialised model of the preset:
latency does not depend on the weights).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.forecast.config import PRESETS  # noqa: E402
from trainers.forecast.export import batch_cases, export_forecaster  # noqa: E402
from trainers.forecast.model import Forecaster, ReturnPredictor  # noqa: E402
from trainers.market.windows import FEATURES  # noqa: E402
from trainers.onnx import check_parity, measure_latency  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny")
    p.add_argument("--window", type=int, default=120)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--batches", default="1,256")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    results = []
    for preset in args.presets.split(","):
        torch.manual_seed(0)
        module = ReturnPredictor(Forecaster(**vars(PRESETS[preset]), n_features=len(FEATURES), window=args.window)).eval()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            export_forecaster(module, args.window, path)
            parity = check_parity(module, path, batch_cases(args.window, [1, 7]), ["features"], tolerance=1e-4)
            latency = measure_latency(module, path, batch_cases(args.window, batches), ["features"], args.iters)
        row = {"preset": preset, "max_abs_error": parity["max_abs_error"], "latency": latency}
        for b in batches:
            lat = latency[f"batch_{b}"]
            row[f"ort_speedup_batch_{b}"] = lat["pytorch_eager"]["p50_ms"] / lat["onnxruntime"]["p50_ms"]
        results.append(row)
        print(json.dumps(row), flush=True)
    write_record({"benchmark": "inference_cpu", "threads": torch.get_num_threads(), "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
