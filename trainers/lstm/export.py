"""ONNX per symbol: `features [batch, window, F] -> probability [batch]` (the sigmoid of the logit),
traced at batch 2 and checked by onnxruntime against PyTorch at batch sizes 1, 7 and 64.

Training workers export each symbol as it finishes (in parallel, `--export`, the default);
`trainers lstm export --run-dir JOB` exports the symbols whose export is missing or stale. A job's symbols
share one architecture: a process runs torch.onnx.export for the first (2.5-5.5 s on the development VM) and
once more for the second (with markers, to work out where its weights go: the second's export_s counts it), and
gives each later symbol that graph with its own weights put in (trainers.onnx.export_reusing, milliseconds);
every file, either way, is checked by onnxruntime against its own symbol's model. export.json's `graph` says
which ("exported" or "reused"); a reused graph's CPU latency is the one measured on the first symbol's file in
the process (`latency_cpu.measured_on` names it).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch

from trainers.errors import UsageError
from trainers.lstm.config import LstmConfig, job_symbols
from trainers.lstm.model import UpProbability
from trainers.onnx import (
    check_parity,
    check_tolerance,
    export_reusing,
    forget_templates,
    measure_latency,
    opset,
    parity_line,
)
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.files import sha256_file
from trainers.runtime.results import merge_results, read_results
from trainers.runtime.rundir import (
    exclusive,
    is_step_number,
    load_checkpoint_states,
    load_run_config,
    resolve_checkpoint,
    single_process_context,
)
from trainers.runtime.written import write_result_json

# The CPU latency of an architecture's graph in this process, by (architecture, iterations, threads): measured on the
# first symbol's file and given to the symbols that reuse its graph (the same operations on other weights), where it
# took about 1 s a symbol of the default model on the development VM, 15x the reused export itself.
_LATENCY: dict[tuple, dict] = {}
EXPORT_BATCH = 2  # the example the graph is traced with; the checks use other sizes
CHECK_BATCHES = (1, 7, 64)


def cases(window: int, n_in: int, batches, seed: int = 0) -> dict[str, tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {f"batch_{b}": (torch.randn((b, window, n_in), generator=g),) for b in batches}


def forget_exports() -> None:
    """At a job's start (training or `trainers lstm export`): its first symbol is exported and measured again, so
    its records name its own files (a process may run several jobs: tests, notebooks)."""
    forget_templates()
    _LATENCY.clear()


def export_symbol(folder: Path, checkpoint: str = "best", tolerance: float = 1e-4, latency_iters: int = 20,
                  parity_threads: int | None = None) -> dict:
    """Export one symbol's run folder; writes model.onnx and export.json, merges `export` into its
    results.json. Raises ExportMismatch (and deletes the file) when onnxruntime disagrees. `parity_threads`:
    onnxruntime's threads in the parity check (None: one where torch has several, else its default)."""
    from trainers.lstm.build import build_model

    folder = Path(folder)
    cfg = load_run_config(folder, LstmConfig)
    results = read_results(folder)
    model_info = results.get("model")
    if not model_info:
        raise UsageError(f"{folder} holds no finished training (no model section in results.json); train it first")
    step, states = load_checkpoint_states(folder, checkpoint)
    model = build_model(cfg, model_info["n_features"])
    model.load_state_dict(states["model"])
    module = UpProbability(model).eval()
    path = folder / "model.onnx"
    for stale in folder.glob(".onnx-*"):  # an export killed mid-write (the folder is this export's: its lock)
        shutil.rmtree(stale)
    t0 = time.perf_counter()
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    # a job's symbols share one architecture: from the second on, the first's graph with the symbol's weights
    architecture = ("lstm", cfg.window, model_info["n_features"], cfg.hidden, cfg.layers, cfg.dropout)
    reused = export_reusing(module, (torch.zeros(EXPORT_BATCH, cfg.window, model_info["n_features"]),), path,
                            input_names=["features"], output_names=["probability"], dynamic_shapes={"x": {0: batch}},
                            architecture=architecture)
    export_s = time.perf_counter() - t0
    # Beside torch on several threads, onnxruntime on one: its own pool (every core, spinning between runs) made
    # these three tiny cases 1.5x slower at the median on the dev VM's 2 cores and 8.4x on the H200 host's 16
    # (bench/results/onnx_parity_threads_cpu.json, gpu_h200/onnx_parity_threads_gpu.json); with torch on one
    # thread its pool was the faster on both. There a reused symbol's export went from 0.18 s to 0.041 s.
    parity = check_parity(module, path, cases(cfg.window, model_info["n_features"], CHECK_BATCHES), ["features"],
                          tolerance, threads=parity_threads or (1 if torch.get_num_threads() > 1 else None))
    parity["batch_sizes"] = list(CHECK_BATCHES)
    timed = (architecture, latency_iters, torch.get_num_threads())
    if not (reused and timed in _LATENCY):  # a reused graph runs as fast as the one it was measured on
        _LATENCY[timed] = {**measure_latency(module, path, cases(cfg.window, model_info["n_features"], (1, 256),
                                                                 seed=1), ["features"], latency_iters),
                           "measured_on": cfg.symbols}
    latency = _LATENCY[timed]
    info = {"path": path.name, "symbol": cfg.symbols, "checkpoint_step": step, "export_batch": EXPORT_BATCH,
            "export_s": export_s, "graph": "reused" if reused else "exported", "opset": opset(path),
            "bytes": path.stat().st_size, "sha256": sha256_file(path),
            "parity": parity, "latency_cpu": latency,
            "input": {"name": "features", "shape": ["batch", cfg.window, model_info["n_features"]]},
            "output": {"name": "probability", "shape": ["batch"], "meaning": "P(close rises over the horizon)"},
            "preprocessing": results.get("preprocessing")}
    write_result_json(folder / "export.json", info)
    merge_results(folder, {"export": info})
    return info


def export_is_current(folder: Path) -> bool:
    """model.onnx is the best checkpoint's and its bytes are the ones export.json records."""
    export = read_results(folder).get("export") if (folder / "results.json").exists() else None
    path = folder / "model.onnx"
    if not export or export.get("stale") or not path.is_file():
        return False
    try:
        best = resolve_checkpoint(CheckpointManager(folder / "checkpoints", single_process_context(), 1,
                                                    logging.getLogger("trainers")), "best")
    except UsageError:
        return False
    return export.get("checkpoint_step") == best and sha256_file(path) == export.get("sha256")


def export_run(run_dir: Path, symbols: str | None = None, checkpoint: str = "best", tolerance: float = 1e-4,
               latency_iters: int = 20, force: bool = False, log=print) -> dict:
    """`trainers lstm export`: every finished symbol of the job (or the ones named) whose export is
    missing or stale; the job summary is rewritten after."""
    check_tolerance(tolerance)
    if checkpoint not in ("best", "latest") and not is_step_number(checkpoint):  # (once, not per symbol)
        raise UsageError(f"--checkpoint {checkpoint!r} is not best, latest or a step number")
    run_dir = Path(run_dir)
    job = read_results(run_dir)
    if not (run_dir / "config.json").is_file() or not job.get("job"):
        raise UsageError(f"--run-dir {run_dir} is not an lstm job folder (no config.json or job results.json); "
                         f"point it at the folder `trainers lstm train` wrote")
    wanted = job_symbols(job, symbols)
    with exclusive(run_dir):  # it writes into the job's folders: not while training (or another) does
        forget_exports()
        return _export_symbols(run_dir, wanted, checkpoint, tolerance, latency_iters, force, log)


def _export_symbols(run_dir: Path, wanted: list[str], checkpoint: str, tolerance: float, latency_iters: int,
                    force: bool, log) -> dict:
    from trainers.lstm.queue import read_marker, write_marker
    from trainers.lstm.summary import refresh_job_summary

    done, skipped, failed = [], [], {}
    for s in wanted:
        folder = run_dir / "symbols" / s
        marker = read_marker(folder)
        if marker is None or marker["status"] != "ok":
            skipped.append(s)
            continue
        if not force and checkpoint == "best" and export_is_current(folder):
            export = read_results(folder)["export"]
        else:
            try:
                export = export_symbol(folder, checkpoint, tolerance, latency_iters)
                log(f"{s}: exported {folder / 'model.onnx'} (step {export['checkpoint_step']}), "
                    f"{parity_line(export['parity'])}")
            except Exception as exc:  # noqa: BLE001 - one symbol's failure is reported, the others go on
                failed[s] = f"{type(exc).__name__}: {exc}"
                log(f"{s}: export failed: {failed[s]}")
                continue
        done.append(s)
        # its marker says what its export is now (it kept a failed export's error, or an older file's checksum)
        exported = {"sha256": export["sha256"], "max_abs_error": export["parity"]["max_abs_error"]}
        if marker.get("export") != exported or "export_error" in marker:
            write_marker(folder, {**{k: v for k, v in marker.items() if k != "export_error"}, "export": exported})
    refresh_job_summary(run_dir)
    return {"exported": done, "not_finished": skipped, "failed": failed}
