"""Reading a finished (or interrupted) run folder back: its config and checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainers.errors import UsageError
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.dist import DistContext


def single_process_context(device: str = "cpu") -> DistContext:
    return DistContext(0, 0, 1, 1, torch.device(device), None)


def load_run_config(run_dir: Path, cls):
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise UsageError(f"--run-dir {run_dir} holds no config.json; point it at a folder written by a training run")
    saved = json.loads(path.read_text())
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
