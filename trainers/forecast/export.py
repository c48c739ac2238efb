"""`trainers forecast export`: ONNX with a dynamic batch axis, checked by onnxruntime at batch sizes
the export never saw (1, 7, 64; traced at 2), with CPU latency p50/p99."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from trainers.errors import UsageError
from trainers.forecast.build import build_model, load_trained_config
from trainers.forecast.config import ForecastConfig, feature_names
from trainers.forecast.model import ReturnPredictor
from trainers.forecast.walk_forward import refuse_walk_forward_folder
from trainers.market.windows import FEATURES
from trainers.onnx import (
    check_parity,
    check_tolerance,
    export_program,
    measure_latency,
    opset,
)
from trainers.runtime.files import sha256_file
from trainers.runtime.results import merge_results, read_results
from trainers.runtime.rundir import exclusive, load_checkpoint_states
from trainers.runtime.written import write_result_json

EXPORT_BATCH = 2  # the example batch the graph is traced with; checks use other sizes
CHECK_BATCHES = (1, 7, 64)
# What the output is, by --target: a return only when the model learned returns.
OUTPUT_NAMES = {"raw": "log_return", "demeaned": "excess_log_return", "rank": "rank_score"}


def export_forecaster(module: torch.nn.Module, window: int, path: Path, n_features: int = len(FEATURES),
                      output_name: str = "log_return") -> list[Path]:
    """Export `features [batch, window, F] -> forecast [batch]` with a dynamic batch axis."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    return export_program(module, (torch.zeros(EXPORT_BATCH, window, n_features),), path,
                          input_names=["features"], output_names=[output_name], dynamic_shapes={"x": {0: batch}})


def batch_cases(window: int, batches, seed: int = 0, n_features: int = len(FEATURES)) -> dict[str, tuple[torch.Tensor]]:
    """Random inputs per batch size, labelled `batch_<b>`."""
    g = torch.Generator().manual_seed(seed)
    return {f"batch_{b}": (torch.randn((b, window, n_features), generator=g),) for b in batches}


def export_run(run_dir: Path, checkpoint: str = "best", tolerance: float = 1e-4, latency_iters: int = 50) -> dict:
    check_tolerance(tolerance)
    if latency_iters < 1:
        raise UsageError(f"--latency-iters {latency_iters} must be >= 1")
    run_dir = Path(run_dir)
    cfg = load_trained_config(run_dir)
    refuse_walk_forward_folder(run_dir, cfg, "export")
    with exclusive(run_dir):
        return _export(run_dir, cfg, checkpoint, tolerance, latency_iters)


def _export(run_dir: Path, cfg: ForecastConfig, checkpoint: str, tolerance: float, latency_iters: int) -> dict:
    step, states = load_checkpoint_states(run_dir, checkpoint)
    model = build_model(cfg)
    model.load_state_dict(states["model"])
    module = ReturnPredictor(model).eval()
    path = run_dir / "model.onnx"
    features = feature_names(cfg)
    output = OUTPUT_NAMES[cfg.target]
    t0 = time.perf_counter()
    export_forecaster(module, cfg.window, path, len(features), output)
    export_s = time.perf_counter() - t0
    parity = check_parity(module, path, batch_cases(cfg.window, CHECK_BATCHES, n_features=len(features)), ["features"], tolerance)
    parity["batch_sizes"] = list(CHECK_BATCHES)
    latency = measure_latency(module, path, batch_cases(cfg.window, (1, 256), seed=1, n_features=len(features)), ["features"],
                              latency_iters)
    info = {"path": path.name, "checkpoint_step": step, "export_batch": EXPORT_BATCH, "export_s": export_s,
            "opset": opset(path), "bytes": path.stat().st_size, "sha256": sha256_file(path), "parity": parity, "latency_cpu": latency,
            "input": {"name": "features", "shape": ["batch", cfg.window, len(features)], "features": features},
            "output": {"name": output, "shape": ["batch"], "target": cfg.target},
            "preprocessing": read_results(run_dir).get("preprocessing")}
    write_result_json(run_dir / "export.json", info)
    merge_results(run_dir, {"export": info})
    return info
