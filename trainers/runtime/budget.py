"""Why a run stops, and the wall-clock / money budget. No torch: configs and the planner use these.

The budget counts the run's elapsed time across restarts (each checkpoint records it), times the
number of billed devices for money.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trainers.errors import UsageError


class StopReason(enum.IntEnum):
    # Larger wins when ranks disagree: a signal beats a budget beats early stopping, and a run that
    # cannot go on (a non-finite loss, a full disk) beats everything: no checkpoint of that state.
    NONE = 0
    COMPLETED = 1
    EARLY_STOP = 2
    MONEY_BUDGET = 3
    TIME_BUDGET = 4
    SIGNAL = 5
    DIVERGED = 6
    DISK_FULL = 7

    @property
    def failed(self) -> bool:
        """The run ended without success and a rerun would end the same way (results.json says why)."""
        return self in (StopReason.DIVERGED, StopReason.DISK_FULL)

    @property
    def skips_evaluation(self) -> bool:
        """The run ends without its final evaluation: a signal (no time for it) or a failure
        (trainers.runtime.results.ending says why, in words a user can act on)."""
        return self == StopReason.SIGNAL or self.failed


@dataclass(frozen=True)
class Budget:
    max_hours: float | None = None
    budget_usd: float | None = None
    usd_per_gpu_hour: float | None = None
    billed_devices: int = 1

    def __post_init__(self):
        if self.max_hours is not None and self.max_hours <= 0:
            raise UsageError(f"--max-hours {self.max_hours} must be > 0 (or left out for no time limit)")
        if self.budget_usd is not None and self.budget_usd <= 0:
            raise UsageError(f"--budget-usd {self.budget_usd} must be > 0 (or left out for no money limit)")
        if self.usd_per_gpu_hour is not None and self.usd_per_gpu_hour < 0:
            raise UsageError(f"--usd-per-gpu-hour {self.usd_per_gpu_hour} must be >= 0")
        if self.budget_usd is not None and not self.usd_per_gpu_hour:
            raise UsageError("--budget-usd needs --usd-per-gpu-hour > 0 to turn hours into money")

    def cost_usd(self, elapsed_s: float) -> float | None:
        if self.usd_per_gpu_hour is None:
            return None
        return elapsed_s / 3600.0 * self.usd_per_gpu_hour * self.billed_devices

    def limit_s(self) -> float | None:
        """The tighter of the two limits as seconds of wall clock (None: no limit)."""
        limits = []
        if self.max_hours is not None:
            limits.append(self.max_hours * 3600.0)
        if self.budget_usd is not None and self.usd_per_gpu_hour:
            limits.append(self.budget_usd / (self.usd_per_gpu_hour * self.billed_devices) * 3600.0)
        return min(limits) if limits else None

    def exceeded(self, elapsed_s: float, reserve_s: float = 0.0) -> StopReason:
        """Which limit `elapsed_s` (plus `reserve_s` still to be spent after stopping) reaches."""
        spent = elapsed_s + reserve_s
        if self.max_hours is not None and spent >= self.max_hours * 3600.0:
            return StopReason.TIME_BUDGET
        cost = self.cost_usd(spent)
        if self.budget_usd is not None and cost is not None and cost >= self.budget_usd:
            return StopReason.MONEY_BUDGET
        return StopReason.NONE
