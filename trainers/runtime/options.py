"""Options every trainer's config shares: device, collective timeout, stops, checkpoints, logging."""

from __future__ import annotations

from dataclasses import dataclass

from trainers.errors import UsageError
from trainers.runtime.budget import Budget
from trainers.runtime.config import option

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass
class RunOptions:
    device: str = option("auto", "auto (GPU when present), cpu or cuda", resume_safe=True, choices=DEVICES)
    collective_timeout_s: float = option(600.0, "seconds a collective may wait for a dead peer", resume_safe=True)
    patience: int = option(3, "early stop after this many evaluations without improvement (0: off)",
                           resume_safe=True)
    ckpt_every: int = option(200, "checkpoint every N optimizer steps (and at each evaluation)", resume_safe=True)
    keep_last: int = option(3, "checkpoints kept besides the best", resume_safe=True)
    log_every: int = option(10, "log training metrics every N steps", resume_safe=True)
    max_hours: float | None = option(None, "wall-clock budget in hours, across restarts", resume_safe=True)
    budget_usd: float | None = option(None, "money budget in USD (needs --usd-per-gpu-hour)", resume_safe=True)
    usd_per_gpu_hour: float | None = option(None, "price of one GPU (or CPU worker) hour, for cost", resume_safe=True)

    def validate_run_options(self) -> None:
        if self.device not in DEVICES:
            raise UsageError(f"--device {self.device!r} is not one of: {', '.join(DEVICES)}")
        for name in ("ckpt_every", "keep_last", "log_every"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.patience < 0:
            raise UsageError(f"--patience {self.patience} must be >= 0")
        if self.collective_timeout_s <= 0:
            raise UsageError(f"--collective-timeout-s {self.collective_timeout_s} must be > 0")
        self.budget(1)  # budget values are checked by Budget itself

    def budget(self, billed_devices: int) -> Budget:
        return Budget(self.max_hours, self.budget_usd, self.usd_per_gpu_hour, billed_devices)
