"""results.json: one schema for every trainer, merged section by section by every command.

    trainer      the trainer's name
    config       the resolved config
    data         where the data came from and how it was split
    model        {"parameters": N, ...trainer-specific shape}
    training     stop_reason, signal, steps, total_steps, best_val {name, value, step},
                 initial_val, last_val, throughput {unit, per_s_steady, per_s_per_device,
                 effective_per_s, breakdown_s}, mfu, wall_time_s_this_attempt,
                 elapsed_s_all_attempts, device_hours, cost_usd, peak_memory_bytes, world_size,
                 device, device_name, restarts
    evaluation   the trainer's metrics beside its baselines (or {"skipped": why})
    export       the ONNX file and its parity check (written by `<trainer> export`)
    run          git commit, versions, host, time written

Training, `evaluate` and `export` each write their own sections and keep the others. Numbers are
finite or null: NaN and infinities never reach the file.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from trainers.runtime.files import atomic_write_json

RESULTS = "results.json"


def read_results(run_dir: Path, warn=None) -> dict:
    """The run's results, or {} when there are none. An unreadable file is moved aside (kept for
    inspection, named in a warning) rather than blocking the results of a finished run."""
    path = Path(run_dir) / RESULTS
    if not path.exists():
        return {}
    try:
        results = json.loads(path.read_text())
        if isinstance(results, dict):
            return results
        problem = f"holds a {type(results).__name__}, not an object"
    except (ValueError, UnicodeDecodeError) as exc:
        problem = f"is not valid JSON ({exc})"
    aside = path.with_name(f"{RESULTS}.unreadable-{int(time.time())}")
    os.replace(path, aside)
    if warn is not None:
        warn(f"{path} {problem}; moved to {aside.name} and starting a fresh one")
    return {}


def merge_results(run_dir: Path, update: dict, warn=None) -> dict:
    """Merge `update`'s top-level sections into results.json atomically; returns the whole."""
    results = read_results(run_dir, warn)
    results.update(update)
    atomic_write_json(Path(run_dir) / RESULTS, results)
    return results


def run_record() -> dict:
    """Where and with what this was produced (the git commit and library versions)."""
    from trainers.runtime.info import git_commit, versions

    return {"git_commit": git_commit(), "versions": versions(), "host": socket.gethostname(),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_training(run_dir: Path, results: dict, trainer: str, best_step: int | None, stopped_by: str | None,
                   warn) -> dict:
    """Rank 0, at the end of training: merge the run's sections in, before the final evaluation
    (a kill during it loses nothing). `stopped_by` a signal: the evaluation is skipped (torchrun's
    SIGKILL follows SIGTERM) and the command that runs it later is named. An export of another
    checkpoint than the best one is marked stale (with the command that redoes it)."""
    if stopped_by is not None:
        evaluation = {"skipped": f"stopped by {stopped_by}; run `trainers {trainer} evaluate --run-dir {run_dir}` "
                                 f"for the metrics"}
    else:
        evaluation = {"pending": "the final evaluation was running when results were last written"}
    results = dict(results, evaluation=evaluation)
    export = read_results(run_dir, warn).get("export")
    if export and export.get("checkpoint_step") != best_step:
        results = dict(results, export=dict(export, stale=f"trained further since; run `trainers {trainer} export "
                                                          f"--run-dir {run_dir}` again"))
    return merge_results(run_dir, results, warn)
