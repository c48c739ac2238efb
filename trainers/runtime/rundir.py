"""The run folder: opening it for a training run, and reading it back (config, checkpoints).

    <run>/config.json      the resolved config, written once by the first run
    <run>/training.log     rank 0's log
    <run>/metrics.jsonl    one JSON object per logged step (and TensorBoard events beside it)
    <run>/checkpoints/     see trainers.runtime.checkpoint
    <run>/results.json     see trainers.runtime.results
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from trainers.errors import UsageError
from trainers.runtime import config as cfgmod
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.dist import DistContext, barrier, broadcast_object
from trainers.runtime.files import atomic_write_json
from trainers.runtime.lock import FolderLock
from trainers.runtime.logs import MetricsWriter, get_logger


@contextlib.contextmanager
def exclusive(run_dir: Path, ctx: DistContext | None = None):
    """Hold the run folder's lock for a command that writes into it (evaluate, export): refused in
    one line, on every rank, while training (or another command) holds it."""
    ctx = ctx or single_process_context()
    lock, problem = None, None
    if ctx.is_main:
        try:
            lock = FolderLock(Path(run_dir)).acquire()
        except UsageError as exc:
            problem = str(exc)
    problem = broadcast_object(ctx, problem)
    if problem:
        raise UsageError(problem)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def single_process_context(device: str = "cpu") -> DistContext:
    return DistContext(0, 0, 1, 1, torch.device(device), None)


def open_run_dir(run_dir: Path, cfg, ctx: DistContext):
    """Create the run folder, write config.json on the first run, and return (logger, metrics).
    Call it after every check that can reject the input, so bad input writes nothing."""
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / "config.json").exists():
            atomic_write_json(run_dir / "config.json", cfgmod.to_dict(cfg))
    barrier(ctx)
    return get_logger(ctx.rank, run_dir), MetricsWriter(run_dir, enabled=ctx.is_main)


def load_run_config(run_dir: Path, cls):
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise UsageError(f"--run-dir {run_dir} holds no config.json; point it at a folder written by a training run")
    try:
        saved = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); it was not written by a training run") from None
    names = {f for f in cls.__dataclass_fields__}
    return cls(**{k: v for k, v in saved.items() if k in names})


def resolve_checkpoint(ckpt: CheckpointManager, which: str) -> int:
    """`best` (lowest validation metric, else newest), `latest`, or a step number."""
    steps = ckpt.complete_steps()
    if not steps:
        raise UsageError(f"{ckpt.dir} holds no complete checkpoint; train first")
    if which == "latest":
        return steps[0]
    if which == "best":
        best = ckpt.best_step()
        return steps[0] if best is None else best
    if not which.isdigit() or int(which) not in steps:
        raise UsageError(f"--checkpoint {which!r} is not best, latest or one of the steps {sorted(steps)}")
    return int(which)


def load_checkpoint_states(run_dir: Path, which: str = "best", device: str = "cpu") -> tuple[int, dict]:
    """(step, {state name: state dict}) of a run's checkpoint, verified against its SHA-256."""
    import logging

    ckpt = CheckpointManager(Path(run_dir) / "checkpoints", single_process_context(), 1, logging.getLogger("trainers"))
    step = resolve_checkpoint(ckpt, which)
    return step, ckpt.load_verified(step, device)["states"]
