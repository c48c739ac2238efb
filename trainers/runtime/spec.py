"""A loop's description of its run, handed to the run boundary with its options and processes:
`Run(cfg, ctx, RunSpec("forecast", states, total_steps, unit="samples"))` (trainers.runtime.run)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainers.runtime.checkpointer import Stateful


@dataclass
class RunSpec:
    """What a loop tells the run boundary about itself, beside its options and its processes: Run(cfg, ctx, spec)."""

    trainer: str
    states: dict[str, Stateful]  # read at resume and at each save: a loop may fill them after entering (a check-only
    total_steps: int | None  #     start builds nothing)
    unit: str = "samples"  # what the throughput counts
    metric_name: str = "loss"  # the validation metric early stopping and the best checkpoint follow
    eval_every: int = 0  # evaluate every N steps (0: at each epoch end)
    flops_per_item: float | None = None  # the MFU's count; None where unknown
    started_at: float | None = None  # when the process began (None: now)
    data_fingerprint: str | None = None  # what a resume checks its data against (data.json)
    sharded_states: dict[str, Stateful] = field(default_factory=dict)  # split across ranks (trainers.runtime.sharded)
    budget_includes_startup: bool = False  # the budget counts from `started_at`, not from the first step
