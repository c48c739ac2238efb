"""Stop decisions agreed by all ranks: signals, wall-clock and money budgets, early stopping.

Any rank may want to stop (it got SIGTERM, its clock says the budget is spent, validation stopped
improving). `StopAgreement.agree()` is a collective called at every step boundary: the ranks take
the max of their stop codes, so all of them stop at the same step and nobody waits forever at the
next collective. torchrun sends SIGKILL 30 s after SIGTERM, so one step plus a checkpoint must fit
in that; the handler only sets a flag, the loop does the work.
"""

from __future__ import annotations

import os
import signal
import time

from trainers.runtime.budget import Budget, StopReason
from trainers.runtime.dist import DistContext, all_reduce_max


class StopAgreement:
    """Collects local reasons to stop; `agree()` turns them into one decision for all ranks."""

    def __init__(self, ctx: DistContext, budget: Budget, elapsed_before_s: float = 0.0):
        self.ctx = ctx
        self.budget = budget
        self.elapsed_before_s = elapsed_before_s  # spent by earlier attempts of the same run
        self._start = time.monotonic()
        self._local = StopReason.NONE
        self.reserve_s = 0.0  # kept free at the end of a budget for the final save and evaluation
        self.signal_name: str | None = None
        self._previous_handlers: dict[int, object] = {}

    def count_from(self, wall_time: float) -> None:
        """Start this attempt's clock at `wall_time` (time.time()) instead of now: the time spent
        before the run began (imports, data, model) is spent budget too."""
        self._start = time.monotonic() - max(0.0, time.time() - wall_time)

    def elapsed_s(self) -> float:
        return self.elapsed_before_s + (time.monotonic() - self._start)

    def request(self, reason: StopReason) -> None:
        self._local = max(self._local, reason)

    def _on_signal(self, signum, _frame) -> None:
        self.signal_name = signal.Signals(signum).name
        self.request(StopReason.SIGNAL)

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the run (checkpoint, results, exit 0). SIGHUP — the terminal went
        away — stops it too when the job runs in the foreground of that terminal, and is ignored by
        a detached job (TRAINERS_ON_HANGUP=ignore, set by the deploy kit), which must outlive it."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
        on_hangup = os.environ.get("TRAINERS_ON_HANGUP", "stop")
        self._previous_handlers[signal.SIGHUP] = signal.signal(
            signal.SIGHUP, signal.SIG_IGN if on_hangup == "ignore" else self._on_signal)

    def restore_signal_handlers(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    def agree_values(self, *values: float) -> tuple[StopReason, list[float]]:
        """Collective: the strongest stop reason, and the max over ranks of each extra value."""
        local = max(self._local, self.budget.exceeded(self.elapsed_s(), self.reserve_s))
        agreed = all_reduce_max(self.ctx, [float(local), *(float(v) for v in values)])
        return StopReason(int(agreed[0])), agreed[1:]

    def agree(self, *flags: bool) -> StopReason | tuple:
        """Collective: the strongest stop reason any rank has (NONE to go on). Extra `flags` (e.g.
        "my clock says checkpoint now") ride on the same all-reduce and come back OR-ed over ranks:
        one collective per step decides everything every rank must do together.

        The budget reserves `reserve_s`: the time the final checkpoint and evaluation will take
        (measured by the run), so the whole run, results included, ends inside the budget."""
        local = max(self._local, self.budget.exceeded(self.elapsed_s(), self.reserve_s))
        agreed = all_reduce_max(self.ctx, [float(local), *(float(f) for f in flags)])
        reason = StopReason(int(agreed[0]))
        return (reason, *(v > 0 for v in agreed[1:])) if flags else reason


class EarlyStopping:
    """Patience on a metric where lower is better; `patience=0` turns it off."""

    def __init__(self, patience: int, min_delta: float = 0.0, best: float | None = None, bad_evals: int = 0):
        self.patience = patience
        self.min_delta = min_delta
        self.best = best
        self.bad_evals = bad_evals

    def update(self, metric: float) -> bool:
        """Record a new value; return True when it is the best so far."""
        if self.best is None or metric < self.best - self.min_delta:
            self.best = metric
            self.bad_evals = 0
            return True
        self.bad_evals += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.bad_evals >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "bad_evals": self.bad_evals}
