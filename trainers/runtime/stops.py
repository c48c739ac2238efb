"""Stop decisions agreed by all ranks: signals, wall-clock and money budgets, early stopping.

Any rank may want to stop (it got SIGTERM, its clock says the budget is spent, validation stopped
improving). `StopAgreement.agree()` is a collective: the ranks take the max of their stop codes, so
all of them stop at the same step and nobody waits forever at the next collective. It runs at the
steps `AgreementCadence` picks (every step, every N, or about once a second: on a GPU each agreement
is a host sync) and at every evaluation and step-cadence checkpoint. torchrun sends SIGKILL 30 s
after SIGTERM, so the steps until the next agreement plus a checkpoint must fit in that; the
handler only sets a flag, the loop does the work.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Callable

import torch

from trainers.runtime.budget import Budget, StopReason
from trainers.runtime.dist import DistContext, all_reduce_max

RESERVE_FACTOR = 2.0
EXIT_ALLOWANCE_S = 2.0  # results.json and leaving the process (torch takes a while)
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop a run with a checkpoint: SIGTERM, SIGINT, and SIGHUP unless the job is detached
    (TRAINERS_ON_HANGUP=ignore: ignored). The process's one handler (StopSignals) takes these and tells every
    listener, so a hangup stops all of a cohort's members, not the one whose run installed its handler last."""
    if os.environ.get("TRAINERS_ON_HANGUP", "stop") == "ignore":
        return signal.SIGTERM, signal.SIGINT
    return HANDLED_SIGNALS


class StopSignals:
    """The process's one handler of the stop signals (stop_signals(); the rest of HANDLED_SIGNALS ignored), which
    tells every listener the signal's name: each run's StopAgreement, and an LSTM job's worker, which holds it for
    the whole job while its symbols' runs open and close inside it. The first holder installs it and the last to
    let go gives back the handlers it found, so no handler is chained to another or restored out of turn (a
    cohort's members once each installed theirs, and the cohort took the signals back after every close)."""

    def __init__(self):
        self._listeners: dict[int, Callable[[str], None]] = {}
        self._previous: dict[int, object] = {}  # the handlers the first holder found
        self._next_id = 0

    def hold(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """`listener(name)` is told each stop signal from here (inside the handler: it only sets flags). Returns the
        call that lets go (once; again does nothing)."""
        key, self._next_id = self._next_id, self._next_id + 1
        self._listeners[key] = listener  # (before the handler: a signal in between would reach no one)
        if len(self._listeners) == 1:  # the first holder
            for sig in HANDLED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal if sig in stop_signals() else signal.SIG_IGN)

        def release() -> None:
            if self._listeners.pop(key, None) is None:
                return
            if not self._listeners:  # the last to let go
                for sig, handler in self._previous.items():
                    signal.signal(sig, handler)
                self._previous.clear()
        return release

    def _on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        for listener in list(self._listeners.values()):
            listener(name)


STOP_SIGNALS = StopSignals()


class Heard:
    """What a holder of the stop signals heard: the last one's name, None before any (`heard_stop_signals`)."""

    name: str | None = None


@contextlib.contextmanager
def heard_stop_signals():
    """The stop signals heard while inside (an LSTM job's worker: between its symbols' runs, and during them)."""
    heard = Heard()
    release = STOP_SIGNALS.hold(lambda name: setattr(heard, "name", name))
    try:
        yield heard
    finally:
        release()


class StopAgreement:
    """Collects local reasons to stop; `agree()` turns them into one decision for all ranks."""

    def __init__(self, ctx: DistContext, budget: Budget, elapsed_before_s: float = 0.0,
                 counted_from: float | None = None):
        self.ctx = ctx
        self.budget = budget
        self.elapsed_before_s = elapsed_before_s  # spent by earlier attempts of the same run
        self._start = time.monotonic()
        self._local = StopReason.NONE
        self.reserve_s = 0.0  # kept free at the end of a budget for the final save and evaluation
        self.exit_allowance_s = 0.0  # and for writing results and leaving the process, when that counts too
        self.signal_name: str | None = None
        self.budget_stop: dict | None = None  # this rank's clock when the budget stop was agreed (`agree`)
        self._agreed_at: float | None = None  # and at the agreement before, with the reserve it kept then (a save or
        self._agreed_reserve_s = 0.0           # an evaluation in between may have raised it since)
        self._release_signals: Callable[[], None] | None = None
        if counted_from is not None:
            self.count_from(counted_from)

    def count_from(self, wall_time: float) -> None:
        """Start this attempt's clock at `wall_time` (time.time()) instead of now, and keep
        EXIT_ALLOWANCE_S at the end: the whole process, start-up (imports, data, model) and exit
        included, ends inside the budget."""
        self._start = time.monotonic() - max(0.0, time.time() - wall_time)
        self.exit_allowance_s = EXIT_ALLOWANCE_S

    def budget_fraction(self) -> float:
        """How much of the wall-clock / money budget is spent, counting the time kept for the end,
        in [0, 1]; 0 without a budget. This rank's clock: agree on it before acting on it together
        (e.g. a learning-rate schedule that follows the budget)."""
        limit = self.budget.limit_s()
        return min(1.0, (self.elapsed_s() + self.reserve_s) / limit) if limit else 0.0

    def keep_for_the_end(self, slowest_save_s: float, slowest_eval_s: float) -> None:
        """What the end of a budget must keep free: the final checkpoint and the final evaluation, at
        twice the slowest of each measured so far (the final evaluation also covers the test split)."""
        self.reserve_s = RESERVE_FACTOR * (slowest_save_s + slowest_eval_s) + self.exit_allowance_s

    def elapsed_s(self) -> float:
        return self.elapsed_before_s + (time.monotonic() - self._start)

    def decision(self) -> dict:
        """results.json's record of a budget stop's decision (none without one)."""
        return {"budget_stop": self.budget_stop} if self.budget_stop else {}

    def request(self, reason: StopReason, signal_name: str | None = None) -> None:
        """This rank wants to stop (agreed at the next agreement). `signal_name`: the signal behind
        it when it came from elsewhere (another worker of a job); the first one named is kept."""
        self._local = max(self._local, reason)
        if signal_name is not None and self.signal_name is None:
            self.signal_name = signal_name

    def _on_signal(self, name: str) -> None:
        self.signal_name = name
        self.request(StopReason.SIGNAL)

    def install_signal_handlers(self):
        """SIGTERM and SIGINT stop the run (checkpoint, results, exit 0). SIGHUP — the terminal went
        away — stops it too when the job runs in the foreground of that terminal, and is ignored by
        a detached job (TRAINERS_ON_HANGUP=ignore, set by the deploy kit), which must outlive it. The run listens
        to the process's one handler (StopSignals: installed here unless a job holds it already). Returns the call
        that stops listening."""
        self._release_signals = STOP_SIGNALS.hold(self._on_signal)
        return self.restore_signal_handlers

    def restore_signal_handlers(self) -> None:
        if self._release_signals is not None:
            self._release_signals()

    def agree(self, *values: float, diverged: torch.Tensor | None = None) -> tuple[StopReason, list[float]]:
        """Collective: the strongest stop reason any rank has (NONE to go on), and the max over ranks
        of each extra value (e.g. "my clock says checkpoint now", "my write is still running"): one
        collective decides everything every rank must do together. `diverged`: a flag on the device
        (FiniteWatch), non-zero when this rank saw a non-finite value: it rides on the same collective,
        so reading it costs no host wait of its own, and any rank's makes every rank stop DIVERGED.

        The budget reserves `reserve_s`: the time the final checkpoint and evaluation will take
        (measured by the run), so the whole run, results included, ends inside the budget."""
        elapsed = self.elapsed_s()
        local = max(self._local, self.budget.exceeded(elapsed, self.reserve_s))
        agreed = all_reduce_max(self.ctx, [float(local), *(float(v) for v in values)], on_device=diverged)
        reason = StopReason(int(agreed[0]))
        if reason in (StopReason.TIME_BUDGET, StopReason.MONEY_BUDGET) and self.budget_stop is None:
            # what results.json records of the decision: a test (or a user) checks the budget held by these,
            # not by a wall clock that a loaded machine stretches after the decision
            self.budget_stop = {"elapsed_s": round(elapsed, 3), "reserve_s": round(self.reserve_s, 3),
                                "limit_s": self.budget.limit_s(), "previous_agreement_elapsed_s":
                                    None if self._agreed_at is None else round(self._agreed_at, 3),
                                "previous_agreement_reserve_s": round(self._agreed_reserve_s, 3)}
        self._agreed_at, self._agreed_reserve_s = elapsed, self.reserve_s
        if diverged is not None:
            if agreed[-1] > 0:
                reason = max(reason, StopReason.DIVERGED)
            agreed = agreed[:-1]
        return reason, agreed[1:]


AGREE_TARGET_S = 1.0  # adaptive agreement: about once a second (a signal still stops within seconds)
AGREE_MAX_STEPS = 100


class AgreementCadence:
    """Which steps agree: a fixed N (`--agree-every N`), or adaptive (0: about AGREE_TARGET_S of
    steady steps, capped at AGREE_MAX_STEPS). Decided identically on every rank: the adaptive N in
    force is the max of every rank's proposal, agreed at the previous agreement."""

    def __init__(self, setting: int | None, gpu_like: bool):
        # default: adaptive where each agreement is a host sync (a GPU, or its rehearsal), else every step
        self.setting = (0 if gpu_like else 1) if setting is None else setting
        self._since = 0
        self._every = 1

    def due(self, force: bool) -> bool:
        """Called once per step: whether this step agrees (`force`: an evaluation, a save, the last step)."""
        self._since += 1
        return force or self._since >= self._every

    def proposal(self, seconds_per_step: float | None) -> int:
        if self.setting > 0:
            return self.setting
        if not seconds_per_step:
            return 1
        return int(min(AGREE_MAX_STEPS, max(1, AGREE_TARGET_S / seconds_per_step)))

    def agreed(self, every: float) -> None:
        self._since = 0
        self._every = max(1, int(every))


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


class FiniteWatch:
    """Whether every loss and metric a run has seen was finite. Kept on the device: watching a loss
    adds two tiny kernels and no host sync; the flag is read at the agreements (host syncs anyway),
    and every save happens at one, so no checkpoint ever holds the state after a non-finite loss."""

    def __init__(self) -> None:
        self._finite: torch.Tensor | None = None
        self._host_bad = False

    def watch(self, value) -> None:
        """A loss or metric: a tensor (any shape, stays on its device), a number, or a list of them."""
        if value is None:
            return
        if isinstance(value, (list, tuple)):
            for v in value:
                self.watch(v)
        elif isinstance(value, torch.Tensor):
            ok = torch.isfinite(value.detach()).all()
            self._finite = ok if self._finite is None else self._finite & ok
        elif not math.isfinite(float(value)):
            self._host_bad = True

    def diverged(self) -> bool:
        return self._host_bad or (self._finite is not None and not bool(self._finite))

    def host_diverged(self) -> bool:
        """A non-finite number seen on the host (no device read)."""
        return self._host_bad

    def device_flag(self) -> torch.Tensor | None:
        """1 where a watched tensor held a non-finite value, 0 else; on the device, unread (None: none
        watched yet). The agreement carries it: `StopAgreement.agree(diverged=...)`."""
        return None if self._finite is None else (~self._finite).to(torch.float32)


class ValidationRecord:
    """The validation metric over a run (lower is better): the untrained model's value (what "it
    learns" is measured from), the last, the best and its step, and early stopping on it. Saved in
    every checkpoint."""

    def __init__(self, patience: int, min_delta: float):
        self.early = EarlyStopping(patience, min_delta)
        self.initial: float | None = None
        self.last: float | None = None
        self.best_step: int | None = None

    @property
    def best(self) -> float | None:
        return self.early.best

    def update(self, step: int, metric: float, name: str, log, metrics) -> bool:
        """A new value, logged and written to the metrics; True when it is the best so far."""
        improved = self.early.update(metric)
        self.last = metric
        if improved:
            self.best_step = step
        metrics.log(step, "val", {name: metric, "best": self.best, "improved": improved})
        log.info("step %d: val %s %.5f%s", step, name, metric,
                 " (best)" if improved else f" ({self.early.bad_evals} without improvement)")
        return improved

    def untrained(self, step: int, metric: float, name: str, log, metrics) -> None:
        """The untrained model's value: what "it learns" is measured from."""
        self.initial = metric
        metrics.log(step, "val", {name: metric, "initial": True})
        log.info("step %d: val %s %.5f (untrained)", step, name, metric)

    def summary(self, name: str) -> dict:
        """results.json's view of it."""
        return {"best_val": {"name": f"val_{name}", "value": self.best, "step": self.best_step},
                "initial_val": self.initial, "last_val": self.last}

    def state_dict(self) -> dict:
        return {"early_stopping": self.early.state_dict(), "initial_metric": self.initial, "last_metric": self.last,
                "best_step": self.best_step}

    def load_state_dict(self, saved: dict) -> None:
        self.early = EarlyStopping(self.early.patience, self.early.min_delta, **saved["early_stopping"])
        self.initial, self.last, self.best_step = saved["initial_metric"], saved["last_metric"], saved["best_step"]
