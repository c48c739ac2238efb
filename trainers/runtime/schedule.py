"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """Multiplier on the base LR for optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int | Callable[[], int], warmup_steps: int,
                    min_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    """`total_steps`: the run's length, or a function asked at each step (a resume on another number of ranks
    changes it: Run.resume(steps_left); the cosine then ends where the loop does)."""
    total = total_steps if callable(total_steps) else (lambda: total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, total(), warmup_steps, min_ratio))
