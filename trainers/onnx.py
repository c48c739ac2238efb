"""ONNX export for any trainer, proven equal to PyTorch by onnxruntime on shapes the export never saw.

The dynamo exporter traces one example; with dynamic dimensions declared, the file must still work
at other sizes. `check_parity` runs onnxruntime and PyTorch side by side on inputs of *different*
shapes and fails above a tolerance; a file that fails is deleted, never left where a consumer
would pick it up. `measure_latency` times both on the CPU (p50/p99).
"""

from __future__ import annotations

import copy
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from trainers.errors import CheckFailed, UsageError
from trainers.runtime.files import atomic_write

INLINE_LIMIT_BYTES = 1_800_000_000  # protobuf caps a single ONNX file at 2 GB


class _NoTorchvisionNotice(logging.Filter):
    """torch's exporter warns, once per export, for each torchvision op it could not register when torchvision
    is absent (four lines: nms, roi_align, roi_pool, ...). No model of the kit uses one; the lines only alarmed
    a newcomer reading the demo's export (issue 66)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torchvision is not installed" not in record.getMessage()


logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(_NoTorchvisionNotice())


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


# Markers: model parameter n holds MARKER_BASE + n for one export (exact in float32 while n < 2^23). A value made
# by arithmetic on parameters (a sum, a difference, a scaling) mostly falls outside [MARKER_BASE, 2 MARKER_BASE) or
# is not a whole number; what does not is caught by GraphTemplate.work_out's bit-for-bit check.
MARKER_BASE = float(1 << 23)


class GraphTemplate:
    """An exported graph (the ModelProto of its file) and the parameters of the module it was exported from. From
    the second module of the same architecture on, `gather` says where each initializer's values sit in the
    parameters (worked out once, by exporting a copy holding markers): a module of that architecture gets the
    file by putting its own parameters in, in milliseconds, where torch.onnx.export took 2.5-5.5 s a per-symbol
    LSTM on the development VM (bench/results/lstm_export_*cpu.json; 500 symbols: about an hour)."""

    def __init__(self, proto, flat: torch.Tensor):
        self.proto, self.flat = proto, flat
        self.gather: dict[str, np.ndarray] | None = None  # initializer name -> indices into the flat parameters
        self.reusable: bool | None = None  # None: not worked out yet

    def work_out(self, marked_proto) -> None:
        """From the export of a module holding markers: each initializer either copies parameters (its marker
        values give which) or is a constant equal in both exports; everything else in the graph is equal too.
        Checked by putting the first module's own parameters back in: the template's values, bit for bit.
        Anything else (weights folded into nodes, arithmetic on parameters): never reused."""
        from onnx import numpy_helper

        self.reusable = False
        if _without_initializers(self.proto) != _without_initializers(marked_proto):
            return
        mine, marked = list(self.proto.graph.initializer), list(marked_proto.graph.initializer)
        if [(t.name, list(t.dims), t.data_type) for t in mine] != [(t.name, list(t.dims), t.data_type) for t in marked]:
            return
        gather, n = {}, self.flat.numel()
        for t, m in zip(mine, marked):
            values = numpy_helper.to_array(m)
            if values.dtype == np.float32 and values.size and ((values >= MARKER_BASE) & (values < MARKER_BASE + n)
                                                               & (values == np.floor(values))).all():
                index = (values.astype(np.int64) - int(MARKER_BASE))
                if self.flat.numpy()[index].tobytes() != numpy_helper.to_array(t).tobytes():  # (a NaN equals itself)
                    return
                gather[t.name] = index
            elif numpy_helper.to_array(t).tobytes() != values.tobytes():
                return
        self.gather, self.reusable = gather, bool(gather)

    def with_parameters(self, flat: torch.Tensor):
        from onnx import ModelProto, numpy_helper

        proto = ModelProto()
        proto.CopyFrom(self.proto)
        values = flat.numpy()
        for t in proto.graph.initializer:
            if t.name in self.gather:
                t.CopyFrom(numpy_helper.from_array(values[self.gather[t.name]], t.name))
        return proto


def _without_initializers(proto) -> bytes:
    """The graph and its model, less the initializers' values and torch.export's record of its symbols (which
    counts exports made in the process)."""
    from onnx import ModelProto

    bare = ModelProto()
    bare.CopyFrom(proto)
    del bare.graph.initializer[:]
    del bare.graph.metadata_props[:]
    return bare.SerializeToString(deterministic=True)


def flat_parameters(module: torch.nn.Module) -> torch.Tensor | None:
    """The module's parameters in one float32 host tensor; None where markers cannot stand in for them (another
    dtype, buffers that an export would hold, 2^23 values or more)."""
    params = [p.detach() for p in module.parameters()]
    if not params or any(p.dtype != torch.float32 for p in params) or next(module.buffers(), None) is not None:
        return None
    flat = torch.cat([p.reshape(-1) for p in params]).cpu()
    return flat if flat.numel() < MARKER_BASE else None


_TEMPLATES: dict[tuple, GraphTemplate] = {}  # this process's exports, by architecture (export_reusing)


def forget_templates() -> None:
    """A new job's first module is exported again (a job's records say which of its own files was exported)."""
    _TEMPLATES.clear()


def export_reusing(module: torch.nn.Module, args: tuple, path: Path, input_names: list[str],
                   output_names: list[str], dynamic_shapes: dict, architecture: tuple) -> bool:
    """export_program for one of many modules of one architecture (`architecture`: what makes their graphs the
    same, beside the module's repr and its parameters' shapes, which are in the key too): the first is exported;
    the second is exported once more with markers (GraphTemplate.work_out), then gets the first graph with its own
    parameters put in, as does every one after, where the graph allows that. True when the graph was reused (the
    second module's time includes the export with markers). The caller's parity check runs the file either way."""
    module.eval()
    flat = flat_parameters(module)
    key = (architecture, repr(module), tuple((n, tuple(p.shape)) for n, p in module.named_parameters()),
           tuple((tuple(a.shape), a.dtype) for a in args), tuple(input_names), tuple(output_names), repr(dynamic_shapes))
    template = _TEMPLATES.get(key) if flat is not None else None
    if template is not None and template.reusable is None:
        marked = copy.deepcopy(module)
        with torch.no_grad():
            start = 0
            for p in marked.parameters():
                p.copy_(torch.arange(start, start + p.numel(), dtype=torch.float64).add_(MARKER_BASE).view(p.shape))
                start += p.numel()
        template.reusable = False  # (until worked out: a failure below is not tried again for every module)
        try:
            with tempfile.TemporaryDirectory(dir=path.parent, prefix=".onnx-markers-") as tmp:
                export_program(marked, args, Path(tmp) / path.name, input_names, output_names, dynamic_shapes)
                template.work_out(_load(Path(tmp) / path.name))
        except Exception as exc:  # noqa: BLE001 - reuse is only quicker: this module and the next are exported
            logging.getLogger("trainers").warning("ONNX: the export with markers failed (%s: %s); every module of "
                                                  "this architecture is exported in full", type(exc).__name__, exc)
    if template is not None and template.reusable:
        proto = template.with_parameters(flat)  # (weights inline: the file is the proto's bytes)
        atomic_write(path, lambda f: f.write(proto.SerializeToString()))
        return True
    export_program(module, args, path, input_names, output_names, dynamic_shapes)
    if flat is not None and key not in _TEMPLATES:  # (under 2^23 float32 values: the file holds them inline)
        _TEMPLATES[key] = GraphTemplate(_load(path), flat)
    return False


def _load(path: Path):
    import onnx

    return onnx.load(str(path))


def onnx_session(path: Path, threads: int | None = None):
    """A CPU session of the file; `threads`: onnxruntime's intra-op threads (None: its default, every core)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def max_abs_error(expected: np.ndarray, got: np.ndarray, _args: tuple) -> float:
    return float(np.max(np.abs(got - expected))) if expected.size else 0.0


def check_parity(module: torch.nn.Module, path: Path, cases: dict[str, tuple[torch.Tensor, ...]],
                 input_names: Sequence[str], tolerance: float,
                 error: Callable[[np.ndarray, np.ndarray, tuple], float] = max_abs_error,
                 threads: int | None = None) -> dict:
    """Run every case (label -> input tensors) through PyTorch and onnxruntime (`threads`: onnx_session's); the
    largest error per case. Raises ExportMismatch (and deletes the file) above `tolerance` or on a shape
    mismatch."""
    session = onnx_session(path, threads)
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
    return {"cases": list(cases), "max_abs_error": worst, "per_case": errors, "tolerance": tolerance,
            "onnxruntime_threads": session.get_session_options().intra_op_num_threads}  # 0: its default


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
