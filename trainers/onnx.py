"""ONNX export for any trainer, proven equal to PyTorch by onnxruntime on shapes the export never saw.

The dynamo exporter traces one example; with dynamic dimensions declared, the file must still work
at other sizes. `check_parity` runs onnxruntime and PyTorch side by side on inputs of *different*
shapes and fails above a tolerance; a file that fails is deleted, never left where a consumer
would pick it up. `measure_latency` times both on the CPU (p50/p99).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from trainers.errors import CheckFailed, UsageError

INLINE_LIMIT_BYTES = 1_800_000_000  # protobuf caps a single ONNX file at 2 GB


class ExportMismatch(CheckFailed):
    """onnxruntime's output differs from PyTorch's by more than the tolerance."""


def check_tolerance(tolerance: float) -> float:
    if not math.isfinite(tolerance) or tolerance <= 0:
        raise UsageError(f"--tolerance {tolerance} must be a finite number > 0 (e.g. 1e-4)")
    return tolerance


def export_program(module: torch.nn.Module, args: tuple, path: Path, input_names: list[str],
                   output_names: list[str], dynamic_shapes: dict) -> list[Path]:
    """torch.onnx (dynamo) export with dynamic axes.

    Weights are stored inside the .onnx file when they fit (one file that works anywhere), else in
    `<name>.data` beside it. Both are written under a temporary folder with their final names, then
    moved into place, so a consumer never sees a half-written model. Returns the files written.
    """
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


def max_abs_error(expected: np.ndarray, got: np.ndarray, _args: tuple) -> float:
    return float(np.max(np.abs(got - expected))) if expected.size else 0.0


def check_parity(module: torch.nn.Module, path: Path, cases: dict[str, tuple[torch.Tensor, ...]],
                 input_names: Sequence[str], tolerance: float,
                 error: Callable[[np.ndarray, np.ndarray, tuple], float] = max_abs_error) -> dict:
    """Run every case (label -> input tensors) through PyTorch and onnxruntime; the largest error per
    case. Raises ExportMismatch (and deletes the file) above `tolerance` or on a shape mismatch."""
    session = onnx_session(path)
    errors = {}
    for label, args in cases.items():
        with torch.no_grad():
            expected = module(*args).numpy()
        got = session.run(None, {name: a.numpy() for name, a in zip(input_names, args)})[0]
        if got.shape != expected.shape:
            path.unlink(missing_ok=True)
            raise ExportMismatch(f"onnxruntime returned shape {got.shape} for {label}, PyTorch {expected.shape}")
        errors[label] = error(expected, got, args)
    worst = max(errors.values())
    if not worst <= tolerance:  # `not <=`: a NaN error fails too
        path.unlink(missing_ok=True)
        raise ExportMismatch(f"ONNX output differs from PyTorch by {worst:.3e} > tolerance {tolerance:.1e} "
                             f"(per case: {errors})")
    return {"cases": list(cases), "max_abs_error": worst, "per_case": errors, "tolerance": tolerance}


def _percentiles(samples_s: list[float]) -> dict:
    ms = np.array(samples_s) * 1000.0
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "iters": len(ms)}


def measure_latency(module: torch.nn.Module, path: Path, cases: dict[str, tuple[torch.Tensor, ...]],
                    input_names: Sequence[str], iters: int, warmup: int = 3) -> dict:
    """onnxruntime and PyTorch eager latency on the CPU, p50/p99 per case."""
    session = onnx_session(path)
    out = {}
    for label, args in cases.items():
        feed = {name: a.numpy() for name, a in zip(input_names, args)}
        ort_times, eager_times = [], []
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            session.run(None, feed)
            if i >= warmup:
                ort_times.append(time.perf_counter() - t0)
        with torch.no_grad():
            for i in range(warmup + iters):
                t0 = time.perf_counter()
                module(*args)
                if i >= warmup:
                    eager_times.append(time.perf_counter() - t0)
        out[label] = {"onnxruntime": _percentiles(ort_times), "pytorch_eager": _percentiles(eager_times)}
    out["threads"] = torch.get_num_threads()
    return out


def parity_line(parity: dict, latency: dict | None = None) -> str:
    """The one line an export prints: the parity check and, given, the CPU latency at batch 1 and 256."""
    text = (f"onnxruntime vs PyTorch max abs error {parity['max_abs_error']:.2e} at batch sizes "
            f"{parity['batch_sizes']}")
    if latency:
        text += (f"; CPU p50 batch 1 {latency['batch_1']['onnxruntime']['p50_ms']:.2f} ms, "
                 f"batch 256 {latency['batch_256']['onnxruntime']['p50_ms']:.2f} ms")
    return text


def opset(path: Path) -> int | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
