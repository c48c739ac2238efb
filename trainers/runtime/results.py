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

import errno
import json
import os
import socket
import time
from pathlib import Path

from trainers.runtime.written import write_result_json

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
    write_result_json(Path(run_dir) / RESULTS, results)  # its hash recorded: package refuses an edited one
    return results


def run_record() -> dict:
    """Where and with what this was produced (the git commit and library versions)."""
    from trainers.runtime.info import kit_commit, versions

    return {"git_commit": kit_commit(), "versions": versions(), "host": socket.gethostname(),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def ending(reason, trainer: str, run_dir: Path, signal_name: str | None, step: int, complete: list[int]) -> str | None:
    """Why the final evaluation is skipped (None: it runs), in words a user can act on: a signal
    (torchrun's SIGKILL follows SIGTERM, no time to evaluate), a non-finite loss, a full disk.
    `complete`: the complete checkpoints' steps, newest first."""
    if not reason.skips_evaluation:
        return None
    name, newest = reason.name.lower(), complete[0] if complete else None
    if name == "signal":
        return (f"stopped by {signal_name or 'a signal on another rank'}; run `trainers {trainer} evaluate "
                f"--run-dir {run_dir}` for the metrics")
    if name == "diverged":
        kept = f"the newest checkpoint (step {newest}) is the last finite state" if newest is not None else \
            "no checkpoint was written before it"
        return (f"training diverged: a non-finite loss or metric by step {step}; nothing after it was saved, {kept}. "
                f"Lower --lr (or the scale of the rewards, costs or inputs) and train again in a new --run-dir")
    kept = f"step {newest}" if newest is not None else "none"  # disk_full
    return (f"the disk filled up at step {step}; the newest complete checkpoint is {kept}. Free space (df -h "
            f"{run_dir}) and run the same command to resume from it")


def write_training(run_dir: Path, results: dict, trainer: str, best_step: int | None, skipped: str | None,
                   log) -> dict | None:
    """Rank 0, at the end of training: merge the run's sections in, before the final evaluation
    (a kill during it loses nothing). `skipped`: why there is no evaluation (see `ending`). An
    export of another checkpoint than the best one is marked stale (with the command that redoes it).
    A full disk is logged, not raised (the run is ending on it: the other ranks wait at a barrier)."""
    try:
        return _write_training(run_dir, results, trainer, best_step, skipped, log.warning)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        log.error("results.json could not be written: %s", exc)
        return None


def _write_training(run_dir: Path, results: dict, trainer: str, best_step: int | None, skipped: str | None,
                    warn) -> dict:
    evaluation = {"skipped": skipped} if skipped else \
        {"pending": "the final evaluation was running when results were last written"}
    results = dict(results, evaluation=evaluation)
    export = read_results(run_dir, warn).get("export")
    if export and export.get("checkpoint_step") != best_step:
        results = dict(results, export=dict(export, stale=f"trained further since; run `trainers {trainer} export "
                                                          f"--run-dir {run_dir}` again"))
    return merge_results(run_dir, results, warn)
