"""An LSTM job's worker, as the scheduler (trainers.lstm.scheduler) and the training loop
(trainers.lstm.cohort) see it: its rank, device, the job's queue, clock and budget, what it heard of the stop
signals, its log, and how it tells the other workers to stop (`Worker.after_step`, `publish_stop`); the device a
worker uses and what the budget bills; a try's outcome (SymbolOutcome) and a broken CUDA context (DeviceLost).

A signal or the job's budget stops every worker's current symbol at the next step with a checkpoint: the
worker that sees it publishes a stop record in the store, the others read it between steps
(`Worker.after_step`).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from trainers.errors import UsageError, first_line
from trainers.lstm import queue as jobqueue
from trainers.lstm.config import LstmConfig
from trainers.lstm.export_behind import ExportsBehind
from trainers.lstm.features import SymbolData
from trainers.lstm.wind_down import WindDown
from trainers.runtime import device as device_mod
from trainers.runtime import faults
from trainers.runtime.budget import Budget, StopReason
from trainers.runtime.device import device_count, set_device
from trainers.runtime.dist import DistContext, pick_device
from trainers.runtime.stops import RESERVE_FACTOR, Heard

# A symbol a stop ended before its last step: not exported, not marked; a new run resumes it
STOPPED_UNFINISHED = (StopReason.SIGNAL, StopReason.TIME_BUDGET, StopReason.MONEY_BUDGET)


class DeviceLost(Exception):
    """The worker's CUDA context broke (runtime.device.context_lost) while it trained `symbols` (`alone`: one
    symbol with nn.LSTM, not a cohort)."""

    def __init__(self, symbols: list[str], error: BaseException, alone: bool):
        super().__init__(f"{type(error).__name__}: {first_line(error)}")
        self.symbols = symbols
        self.alone = alone


@dataclass
class SymbolOutcome:
    reason: StopReason
    signal: str | None
    steps: int
    results: dict | None
    step_seconds: float = 0.0  # host time in its training steps (in a cohort: its share of the stacked steps)
    phase_seconds: dict | None = None  # in a cohort: its share of each part of the cohort's loop (cohort.PHASES)


class Worker:
    """One torchrun worker: its rank, device, the queue, the job's clock and budget, its log."""

    def __init__(self, cfg: LstmConfig, ctx: DistContext, device: torch.device, log: logging.Logger,
                 queue: jobqueue.JobQueue, attempt: dict, heard: Heard | None = None):
        self.cfg = cfg
        self.rank = ctx.rank
        self.world_size = ctx.world_size
        self.device = device
        self.log = log
        self.queue = queue
        self.attempt = attempt
        self.restart = ctx.restart_count
        self.budget = Budget(cfg.max_hours, cfg.budget_usd, cfg.usd_per_gpu_hour, attempt["devices"])
        self.heard = heard if heard is not None else Heard()  # the stop signals this process got (the job's)
        # Out of device memory in a cohort: the models per stacked pass its passes were halved to (training steps,
        # evaluations), where this worker's next cohorts start; and, when that did not cure it, at most how
        # many symbols its next cohorts take (smaller_cohorts)
        self.rows_per_pass: dict[str, int | None] = {}
        self.max_cohort: int | None = None
        self.exports: ExportsBehind | None = None  # its exporter process (--export-behind), else exports in line
        self.wind_down = WindDown()  # what the end of the job's budget keeps free for this worker's ends
        self.started_over: set[str] = set()  # --restart: the symbols whose run this worker has started over

    def once(self, scfg: LstmConfig) -> LstmConfig:
        """A symbol's run options as its run opens: a symbol marked to start over (--restart, jobqueue.mark_restart)
        starts over the first time this process opens its run (a retry after an error, alone or out of a failed
        cohort, resumes from that run's checkpoint, as without --restart)."""
        restart = scfg.symbols not in self.started_over and jobqueue.restart_marked(Path(scfg.run_dir))
        self.started_over.add(scfg.symbols)
        return scfg.replaced(restart=restart)

    def smaller_cohorts(self, size: int, error: BaseException) -> None:
        """A cohort of `size` symbols ran out of device memory beyond what smaller passes cure (its data, its
        stack, or one model a pass): this worker's next cohorts take at most half as many (1: one at a time)."""
        self.max_cohort = max(1, min(self.max_cohort or size, size) // 2)
        self.log.warning("a cohort of %d symbols ran out of device memory (%s); each is tried alone, and this "
                         "worker's next cohorts take at most %d", size, first_line(error),
                         self.max_cohort)

    def one_at_a_time(self, size: int, error: BaseException) -> None:
        """A cohort of `size` symbols failed as a whole: an error of the stack's own (not a member's, not out of
        memory, not a broken context), which would end the worker and, through torchrun's restarts, the job. Its
        symbols are tried alone (nn.LSTM, the path of `--cohort 1`) on a first try of their own, and this worker
        takes one symbol at a time from now on: the stacked code failed, not the symbols."""
        self.max_cohort = 1
        self.log.warning("a cohort of %d symbols failed (%s: %s); each is tried alone, and this worker trains one "
                         "symbol at a time from now on", size, type(error).__name__, first_line(error), exc_info=error)

    def elapsed_s(self) -> float:
        return self.attempt["elapsed_before_s"] + time.time() - self.attempt["started_at"]

    def over_budget(self, training: int | None = None, starting_s: float = 0.0) -> StopReason:
        """The job's budget, keeping free what this worker's stop would still cost (trainers.lstm.wind_down): the
        ends of `training` symbols (default: those it trains now), its exports waiting, the summary, the exit; and
        `starting_s` before any of that (a claim's start)."""
        return self.budget.exceeded(self.elapsed_s(), starting_s + self.reserve_s(training))

    def reserve_s(self, training: int | None = None, finishing: int | None = None) -> float:
        """What a stop now would still cost (trainers.lstm.wind_down), the exports at the pace measured so far."""
        if self.exports is not None:  # exporting behind: at the exporter's pace
            return self.wind_down.reserve_s(training, self.exports.still_exporting(), self.exports.seconds_per_export(),
                                            finishing)
        return self.wind_down.reserve_s(training, 0, self.wind_down.seconds_per_export() if self.cfg.export else 0.0,
                                        finishing)

    def no_use_stopping_now(self) -> bool:
        """Every symbol this worker trains is at its last step: stopped now, each still pays its end (checkpoint,
        evaluation, results), and only their exports are saved. A stop is of use only where those exports, at their
        measured cost (not doubled: the margin would leave symbols trained to their last step unexported in a job
        that had the time), take the job past its budget and it is inside it without them; otherwise (no exports,
        they fit, or past it anyway) they end trained, where a stop would leave them to a rerun to end again."""
        if not self.wind_down.all_at_last_step:
            return False
        elapsed, without_theirs = self.elapsed_s(), self.reserve_s(finishing=0)
        theirs = (self.reserve_s() - without_theirs) / RESERVE_FACTOR
        return self.budget.exceeded(elapsed, without_theirs) != StopReason.NONE or \
            self.budget.exceeded(elapsed, without_theirs + theirs) == StopReason.NONE

    @property
    def signalled(self) -> str | None:
        """The last stop signal this process got (between symbols or inside one). The job holds the process's one
        handler (runtime.stops.StopSignals) for its whole life: between symbols (data, export, the wait at the end)
        a signal only sets this; while a cohort trains, each member's run hears it too and stops at its next step."""
        return self.heard.name

    def quiet_console(self, log: logging.Logger) -> None:
        """A symbol's run logs to its own training.log; on the console the job log speaks for the
        workers (one line per claim, result, retry), so the run's console handler keeps warnings only."""
        for handler in log.handlers:  # (the console's is runtime.logs' BarAwareHandler; a file's is a FileHandler)
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.WARNING)

    def stopping(self) -> bool:
        return self.signalled is not None or self.queue.stop_record(force=True) is not None

    def publish_stop(self, reason: str, symbol: str | None, step: int | None, signal_name: str | None,
                     training: int | None = None) -> dict:
        """Stop the job (the first record published stands). A budget stop says what it kept for the end of `training`
        symbols (default: those this worker trains now)."""
        mine = {"reason": reason, "signal": signal_name, "worker": self.rank, "symbol": symbol, "step": step}
        record = self.queue.request_stop(mine)
        if record == mine:
            kept = ""
            if reason in ("time_budget", "money_budget"):
                kept = (f" (elapsed {self.elapsed_s():.1f} s, budget {self.budget.limit_s():.1f} s, "
                        f"{self.reserve_s(training):.1f} s kept for the end)")
            self.log.info("stopping the job: %s%s%s%s", reason, f" ({signal_name})" if signal_name else "",
                          f" at {symbol} step {step}" if symbol else "", kept)
        return record

    def after_step(self, run, symbol: str, step: int, attempt: int) -> None:
        """Between a symbol's optimizer step and its step_done: the test hook that makes a symbol
        raise, the job's budget, and stops published by other workers. (TRAINERS_FAULT fires in the
        run's step_done as this worker's rank: `faults.as_worker` in run_job.)"""
        faults.maybe_raise(symbol, step, attempt, self.device)
        if self.signalled is not None and self.queue.stop_record() is None:
            self.publish_stop("signal", symbol, step, self.signalled)  # this process got it: tell the others
        record = self.queue.stop_record()
        if record is None:
            over = self.over_budget()
            if over != StopReason.NONE and self.no_use_stopping_now():
                over = StopReason.NONE
            if over != StopReason.NONE:
                record = self.publish_stop(over.name.lower(), symbol, step, None)
        if record is not None:
            if record["reason"] == "signal":
                run.request_stop(StopReason.SIGNAL, f"{record['signal']} (received by worker {record['worker']})")
            else:
                run.request_stop(StopReason[record["reason"].upper()])


# the symbols' outcomes, or the error that took one out of the cohort
TrainCohort = Callable[[LstmConfig, list[SymbolData], Worker, int], dict[str, "SymbolOutcome | BaseException"]]


def worker_device(cfg: LstmConfig, local_rank: int) -> torch.device:
    """Worker r of a node uses GPU r // jobs_per_gpu; on CPU every worker shares the CPU."""
    if cfg.device == "cpu" or (cfg.device == "auto" and not device_mod.accelerator_available()):
        if cfg.jobs_per_gpu > 1:
            raise UsageError(f"--jobs-per-gpu {cfg.jobs_per_gpu} packs workers onto GPUs; on CPU every worker "
                             f"shares the CPU: set their number with torchrun --nproc_per_node")
        return torch.device("cpu")
    index = local_rank // cfg.jobs_per_gpu
    visible = device_count()
    if visible and index >= visible:
        raise UsageError(f"worker {local_rank} of this node would use GPU {index}, but {visible} are visible: start "
                         f"at most --jobs-per-gpu {cfg.jobs_per_gpu} x {visible} = {cfg.jobs_per_gpu * visible} "
                         f"workers per node")
    device = pick_device(index, cfg.device)
    set_device(device)
    return device


def job_logger(job_dir: Path, rank: int, device: torch.device) -> logging.Logger:
    """Every worker appends its lines to <job>/training.log (one write per line) and the console."""
    log = logging.getLogger(f"trainers.lstm.worker{rank}")
    log.handlers.clear()
    log.propagate = False
    log.setLevel(logging.INFO)
    fmt = logging.Formatter(f"%(asctime)s [worker {rank} {device}] %(levelname)s %(message)s", "%H:%M:%S")
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(job_dir / "training.log")):
        handler.setFormatter(fmt)
        log.addHandler(handler)
    return log


def close_job_logger(rank: int) -> None:
    for handler in logging.getLogger(f"trainers.lstm.worker{rank}").handlers:
        handler.close()


def billed_devices(world_size: int, local_world_size: int, jobs_per_gpu: int, device: torch.device) -> int:
    """The devices the job's budget bills: on CUDA the GPUs its workers use (worker r of a node on GPU
    r // jobs_per_gpu, so a node's last GPU counts when it holds fewer than K workers: world // K undercounted it)."""
    if device.type != "cuda":
        return world_size
    nodes = max(1, world_size // max(1, local_world_size))
    return nodes * -(-local_world_size // jobs_per_gpu)
