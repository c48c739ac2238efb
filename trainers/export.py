"""ONNX export, proven equal to PyTorch by onnxruntime on batch sizes the export never saw."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from trainers.data.windows import FEATURES
from trainers.errors import UsageError
from trainers.runtime.checkpoint import CheckpointManager, atomic_write_json

EXPORT_BATCH = 2  # the example batch the graph is traced with; checks use other sizes


class ExportMismatch(Exception):
    """onnxruntime's output differs from PyTorch's by more than the tolerance."""


INLINE_LIMIT_BYTES = 1_800_000_000  # protobuf caps a single ONNX file at 2 GB


def export_onnx(module: torch.nn.Module, example: torch.Tensor, path: Path) -> list[Path]:
    """Export with a dynamic batch axis (input `features` [batch, window, n_features]).

    Weights are stored inside the .onnx file when they fit (one file that works anywhere), else in
    `<name>.data` beside it. Both are written under a temporary folder with their final names, then
    moved into place, so a consumer never sees a half-written model. Returns the files written.
    """
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    return export_program(module, (example,), path, input_names=["features"], output_names=["log_return"],
                          dynamic_shapes={"x": {0: batch}})


def export_program(module: torch.nn.Module, args: tuple, path: Path, input_names: list[str],
                   output_names: list[str], dynamic_shapes: dict) -> list[Path]:
    """torch.onnx (dynamo) export with dynamic axes, written as described in `export_onnx`."""
    module.eval()
    program = torch.onnx.export(module, args, input_names=input_names, output_names=output_names,
                                dynamic_shapes=dynamic_shapes, dynamo=True, verbose=False)
    weight_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".onnx-") as tmp:
        staged = Path(tmp) / path.name
        program.save(staged, external_data=weight_bytes > INLINE_LIMIT_BYTES)
        written = sorted(Path(tmp).iterdir(), key=lambda p: p == staged)  # the .onnx last
        for f in written:
            os.replace(f, path.parent / f.name)
    return [path.parent / f.name for f in written]


def onnx_session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def check_parity(module: torch.nn.Module, path: Path, shape_tail: tuple[int, ...], batch_sizes: list[int],
                 tolerance: float, seed: int = 0) -> dict:
    """Max abs error between onnxruntime and PyTorch for each batch size; raise above `tolerance`."""
    session = onnx_session(path)
    g = torch.Generator().manual_seed(seed)
    errors = {}
    for b in batch_sizes:
        x = torch.randn((b, *shape_tail), generator=g)
        with torch.no_grad():
            expected = module(x).numpy()
        got = session.run(None, {"features": x.numpy()})[0]
        if got.shape != expected.shape:
            raise ExportMismatch(f"onnxruntime returned shape {got.shape} for batch {b}, PyTorch {expected.shape}")
        errors[b] = float(np.max(np.abs(got - expected)))
    worst = max(errors.values())
    if worst > tolerance:
        raise ExportMismatch(f"ONNX output differs from PyTorch by {worst:.3e} > tolerance {tolerance:.1e} "
                             f"(per batch size: {errors})")
    return {"batch_sizes": batch_sizes, "max_abs_error": worst, "per_batch": {str(k): v for k, v in errors.items()},
            "tolerance": tolerance}


def _percentiles(samples_s: list[float]) -> dict:
    ms = np.array(samples_s) * 1000.0
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "iters": len(ms)}


def measure_latency(module: torch.nn.Module, path: Path, shape_tail: tuple[int, ...], batch_sizes: list[int],
                    iters: int, warmup: int = 3) -> dict:
    """onnxruntime and PyTorch eager latency on CPU, p50/p99 per batch size."""
    session = onnx_session(path)
    out = {}
    for b in batch_sizes:
        x = torch.randn((b, *shape_tail))
        feed = {"features": x.numpy()}
        ort_times, eager_times = [], []
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            session.run(None, feed)
            if i >= warmup:
                ort_times.append(time.perf_counter() - t0)
        with torch.no_grad():
            for i in range(warmup + iters):
                t0 = time.perf_counter()
                module(x)
                if i >= warmup:
                    eager_times.append(time.perf_counter() - t0)
        out[f"batch_{b}"] = {"onnxruntime": _percentiles(ort_times), "pytorch_eager": _percentiles(eager_times)}
    out["threads"] = torch.get_num_threads()
    return out


def export_forecast_run(run_dir: Path, checkpoint: str = "best", tolerance: float = 1e-4,
                        latency_iters: int = 50) -> dict:
    from trainers.jobs.forecast import ForecastConfig, build_model, write_results
    from trainers.models.forecaster import ReturnPredictor
    from trainers.runfiles import load_run_config, resolve_checkpoint, single_process_context

    if tolerance <= 0:
        raise UsageError(f"--tolerance {tolerance} must be > 0")
    if latency_iters < 1:
        raise UsageError(f"--latency-iters {latency_iters} must be >= 1")
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, ForecastConfig)
    import logging

    ckpt = CheckpointManager(run_dir / "checkpoints", single_process_context(), 1, logging.getLogger("export"))
    step = resolve_checkpoint(ckpt, checkpoint)
    model = build_model(cfg)
    model.load_state_dict(ckpt.load_verified(step, "cpu")["model"])
    module = ReturnPredictor(model).eval()
    tail = (cfg.window, len(FEATURES))
    path = run_dir / "model.onnx"
    t0 = time.perf_counter()
    export_onnx(module, torch.zeros(EXPORT_BATCH, *tail), path)
    export_s = time.perf_counter() - t0
    try:
        parity = check_parity(module, path, tail, [1, 7, 64], tolerance)
    except ExportMismatch:
        path.unlink(missing_ok=True)  # never leave an unverified model where a consumer would pick it up
        raise
    latency = measure_latency(module, path, tail, [1, 256], latency_iters)
    results_path = run_dir / "results.json"
    preprocessing = json.loads(results_path.read_text()).get("preprocessing") if results_path.exists() else None
    info = {"path": path.name, "checkpoint_step": step, "export_batch": EXPORT_BATCH, "export_s": export_s,
            "opset": _opset(path), "bytes": path.stat().st_size, "parity": parity, "latency_cpu": latency,
            "input": {"name": "features", "shape": ["batch", cfg.window, len(FEATURES)], "features": list(FEATURES)},
            "output": {"name": "log_return", "shape": ["batch"]}, "preprocessing": preprocessing}
    atomic_write_json(run_dir / "export.json", info)
    write_results(run_dir, {"export": info})
    return info


def _opset(path: Path) -> int | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
