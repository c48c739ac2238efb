"""The run boundary: what every training loop calls at its edges. It owns no loop.

    with Run(cfg, ctx, "forecast", states={"model": model, "optimizer": opt, ...},
             total_steps=n, unit="samples") as run:
        start = run.resume()                 # every state, this rank's RNG and its data position
        step = start.step
        while True:
            ... one optimizer step ...
            step += 1
            if run.should_log(step):
                run.log_train(step, {"loss": ...})
            if run.should_eval(step, end_of_epoch):
                with run.timing("evaluation"):
                    run.evaluated(step, validation_loss(...))
            if run.step_done(step, position, items) != StopReason.NONE:
                break
        return run.finish(summary, evaluate=...)

What it guarantees, for every trainer alike:
- resume restores every object in `states` (anything with state_dict/load_state_dict) and in
  `sharded_states` (states split across ranks, e.g. FSDP2's model and optimizer, written with
  torch.distributed.checkpoint, each rank its part), the run's
  own counters (elapsed time, early stopping, best), and *this rank's* RNG streams and data position;
- `step_done` checkpoints at the step cadence (and after each evaluation, with the metric), agrees
  on a stop with every rank (signal, budget, early stop, the last step) and saves exactly once on a
  stop, so the newest checkpoint is always the last step trained;
- `finish` writes the training section of results.json first (so a kill during evaluation loses
  nothing), skips evaluation after a signal (torchrun's SIGKILL comes 30 s after SIGTERM) and says
  how to run it later, then merges the evaluation in; signal handlers stay installed until then;
- throughput is measured over windows between log points, after the first window (compile and
  warm-up), synchronised with the device at window edges, with evaluation and checkpoint time
  taken out; the job's effective throughput and the time breakdown are reported beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from trainers.errors import CheckPassed, RunFailed, UsageError
from trainers.runtime import config as cfgmod
from trainers.runtime import rng
from trainers.runtime.async_save import BackgroundWrite, HostSnapshot
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.dist import DistContext, all_reduce_max, barrier, broadcast_object
from trainers.runtime.faults import maybe_inject
from trainers.runtime.files import atomic_write_json, remove_stale_temp_files
from trainers.runtime.flops import peak_tflops
from trainers.runtime.info import device_name, peak_memory_bytes, run_facts
from trainers.runtime.lock import FolderLock, describe_holder, held_by_other
from trainers.runtime.logs import progress
from trainers.runtime.results import merge_results, read_results, run_record
from trainers.runtime.rundir import open_run_dir
from trainers.runtime.stops import EarlyStopping, StopAgreement, StopReason

HEARTBEAT = "heartbeat.json"
DATA_RECORD = "data.json"  # the fingerprint of the data a run started with
HEARTBEAT_S = 30.0
RESERVE_FACTOR = 2.0
AGREE_TARGET_S = 1.0  # adaptive agreement: about once a second (a signal still stops within seconds)
AGREE_MAX_STEPS = 100
EXIT_ALLOWANCE_S = 2.0  # results.json and leaving the process (torch takes a while), when all of it must fit


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


@dataclass
class Start:
    """Where a loop continues: the last finished step and this rank's data position."""

    step: int = 0
    position: dict | None = None  # this rank's own position; None on a fresh start or a new world size
    position_rank0: dict | None = None  # rank 0's position (what a changed world size can fall back to)
    resumed: bool = False


@dataclass
class _Clock:
    """Step time in windows between log points (device-synchronised at the edges)."""

    window_start: float = 0.0
    window_items: int = 0
    window_steps: int = 0
    excluded_in_window: float = 0.0
    windows_closed: int = 0
    steady_items: int = 0
    steady_s: float = 0.0
    steady_steps: int = 0
    first_window_s: float | None = None
    items_this_attempt: int = 0
    phases: dict = field(default_factory=lambda: {"evaluation": 0.0, "checkpoint": 0.0})


class Run:
    def __init__(self, cfg, ctx: DistContext, trainer: str, states: dict[str, Stateful], total_steps: int | None,
                 unit: str = "samples", metric_name: str = "loss", eval_every: int = 0,
                 flops_per_item: float | None = None, started_at: float | None = None,
                 data_fingerprint: str | None = None, sharded_states: dict[str, Stateful] | None = None,
                 budget_includes_startup: bool = False):
        self.cfg = cfg
        self.ctx = ctx
        self.trainer = trainer
        self.states = states
        # Both dicts are read at resume and at each save, so a loop may fill them after entering the
        # run (a check-only start then never builds the model).
        self.sharded_states = sharded_states if sharded_states is not None else {}
        self.total_steps = total_steps
        self.unit = unit
        self.metric_name = metric_name
        self.eval_every = eval_every
        self.flops_per_item = flops_per_item
        self.data_fingerprint = data_fingerprint
        # The budget's clock starts at `started_at` (the process start), not when the run is entered,
        # and keeps EXIT_ALLOWANCE_S for the end too: the whole process, not only the loop, ends
        # inside --max-hours / --budget-usd.
        self.budget_includes_startup = budget_includes_startup
        self.run_dir = Path(cfg.run_dir)
        self.started_at = started_at if started_at is not None else time.time()
        self.step = 0
        self.reason = StopReason.NONE
        self.initial_metric: float | None = None
        self.last_metric: float | None = None
        self.best_step: int | None = None
        self._metric_to_save: tuple[int, float] | None = None
        self._last_saved_step = -1
        self._pending_log: tuple[int, dict] | None = None
        self._clock = _Clock()
        self._last_beat = 0.0
        self._last_save_time = time.monotonic()
        self._slowest = {"checkpoint": 0.0, "evaluation": 0.0}
        self._since_agree = 0
        self._agree_every = 1
        self._pending: BackgroundWrite | None = None  # a checkpoint being written behind the loop
        self._snapshot = HostSnapshot()
        self._writes_behind_s = 0.0
        self._exit = contextlib.ExitStack()

    # ---- lifetime ------------------------------------------------------------------------------
    def __enter__(self) -> "Run":
        self._take_lock()
        self.log, self.metrics = open_run_dir(self.run_dir, self.cfg, self.ctx)
        self._record_data()
        self._exit.callback(self.metrics.close)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", self.ctx, self.cfg.keep_last, self.log)
        self.early = EarlyStopping(self.cfg.patience, getattr(self.cfg, "min_delta", 0.0))
        self.stopper = StopAgreement(self.ctx, self.cfg.budget(self.ctx.world_size))
        if self.budget_includes_startup:
            self.stopper.count_from(self.started_at)
            self._update_reserve()
        self.stopper.install_signal_handlers()
        self._exit.callback(self.stopper.restore_signal_handlers)
        self.bar = progress(self.total_steps, 0, self.ctx.is_main, self.trainer)
        self._exit.callback(self.bar.close)
        self.entered_at = time.time()
        return self

    def __exit__(self, *exc) -> None:
        self._exit.close()

    def _take_lock(self) -> None:
        """Collective: rank 0 locks the run folder for the job's life (one job per folder); every rank
        gets the same one-line refusal when another job holds it. Leftover temp files of a killed
        writer are removed once the lock is ours. `TRAINERS_CHECK_ONLY=1` stops here: every check a
        run makes before its first write has passed (the deploy kit runs this before torchrun, so a
        usage error is not retried --max-restarts times)."""
        check_only = os.environ.get("TRAINERS_CHECK_ONLY") == "1"
        problem = None
        if self.ctx.is_main:
            try:
                self._check_data_unchanged()
                if check_only:
                    holder = held_by_other(self.run_dir)
                    if holder:
                        raise UsageError(f"--run-dir {self.run_dir} is in use by {describe_holder(holder)}")
                else:
                    lock = FolderLock(self.run_dir, hint=" (`bash deploy_8gpu.sh stop`)")
                    lock.acquire(warn=lambda msg: print(f"warning: {msg}", file=sys.stderr))
                    self._exit.callback(lock.release)
                    remove_stale_temp_files(self.run_dir)
            except UsageError as exc:
                problem = str(exc)
        problem = broadcast_object(self.ctx, problem)
        if problem:
            self._exit.close()
            raise UsageError(problem)
        if check_only:
            raise CheckPassed(f"{self.trainer}: every check before training passed for {self.run_dir}")

    @property
    def signal_name(self) -> str | None:
        return self.stopper.signal_name

    # ---- resume --------------------------------------------------------------------------------
    def resume(self) -> Start:
        """Collective. Restores the newest verified checkpoint into `states`, the run's counters and
        this rank's RNG; on a fresh start seeds this rank's own RNG streams instead."""
        if self.cfg.restart:
            aside = self.ckpt.set_aside() if self.ctx.is_main else None
            barrier(self.ctx)
            if aside is not None:
                self.log.warning("--restart: starting over from step 0; the old checkpoints are in %s", aside)
                (self.run_dir / HEARTBEAT).unlink(missing_ok=True)
        resumed = self.ckpt.resume(self.ctx.device, sharded=self.sharded_states) if self.sharded_states \
            else self.ckpt.resume(self.ctx.device)
        if resumed is None:
            rng.seed_everything(rng.rank_seed(self.cfg.seed, self.ctx.rank))
            start = Start()
        else:
            for name, obj in self.states.items():
                obj.load_state_dict(resumed.shared["states"][name])
            saved = resumed.shared["run"]
            self.stopper.elapsed_before_s = self._elapsed_including_lost_time(saved["elapsed_s"])
            self.early = EarlyStopping(self.cfg.patience, getattr(self.cfg, "min_delta", 0.0), **saved["early_stopping"])
            self.initial_metric, self.last_metric = saved["initial_metric"], saved["last_metric"]
            self.best_step = saved["best_step"]
            position = None
            if resumed.rank_state is not None:
                rng.restore(resumed.rank_state["rng"], self.ctx.device)
                position = resumed.rank_state["position"]
            else:
                rng.seed_everything(rng.rank_seed(self.cfg.seed, self.ctx.rank) + resumed.step)
            start = Start(resumed.step, position, saved["position_rank0"], True)
            self._last_saved_step = resumed.step
            self.log.info("resumed from checkpoint step %d%s", resumed.step,
                          f" (position {position})" if position else "")
        self.step = start.step
        self.bar.reset(total=self.total_steps)
        self.bar.update(start.step)
        self._clock.window_start = time.perf_counter()
        return start

    def _update_reserve(self) -> None:
        """What the end of a budget must keep free: the final checkpoint and the final evaluation, at
        twice the slowest of each measured so far (the final evaluation also covers the test split)."""
        self.stopper.reserve_s = RESERVE_FACTOR * (self._slowest["checkpoint"] + self._slowest["evaluation"]) + \
            (EXIT_ALLOWANCE_S if self.budget_includes_startup else 0.0)

    def _check_data_unchanged(self) -> None:
        """A run trains on one dataset: a resume whose data fingerprint differs from the one the run
        started with is refused (its positions and checkpoints index into the old data)."""
        if self.data_fingerprint is None:
            return
        path = self.run_dir / DATA_RECORD
        try:
            saved = json.loads(path.read_text()).get("fingerprint") if path.exists() else None
        except (OSError, ValueError, AttributeError):
            saved = None
        if saved is not None and saved != self.data_fingerprint:
            raise UsageError(f"--run-dir {self.run_dir} was trained on other data (fingerprint {saved[:12]}..., now "
                             f"{self.data_fingerprint[:12]}...); resume with the data it started with, or use a new "
                             f"--run-dir")

    def _record_data(self) -> None:
        if self.data_fingerprint is not None and self.ctx.is_main and not (self.run_dir / DATA_RECORD).exists():
            atomic_write_json(self.run_dir / DATA_RECORD, {"fingerprint": self.data_fingerprint})

    def _elapsed_including_lost_time(self, checkpoint_elapsed: float) -> float:
        """The budget counts time an earlier attempt spent after its last checkpoint (it crashed or
        was killed): its heartbeat says how long it ran. Collective (rank 0 reads, all agree)."""
        beat = None
        if self.ctx.is_main:
            try:
                beat = json.loads((self.run_dir / HEARTBEAT).read_text()).get("elapsed_s")
            except (OSError, ValueError, AttributeError):
                beat = None
        beat = broadcast_object(self.ctx, beat)
        if isinstance(beat, (int, float)) and beat > checkpoint_elapsed:
            self.log.info("counting %.0f s an earlier attempt spent after its last checkpoint", beat - checkpoint_elapsed)
            return float(beat)
        return checkpoint_elapsed

    def _heartbeat(self, step: int, force: bool = False) -> None:
        """Rank 0 records the elapsed time every HEARTBEAT_S seconds (what a crash would otherwise lose)."""
        now = time.monotonic()
        if not self.ctx.is_main or (not force and now - self._last_beat < HEARTBEAT_S):
            return
        self._last_beat = now
        atomic_write_json(self.run_dir / HEARTBEAT, {"elapsed_s": self.stopper.elapsed_s(), "step": step,
                                                     "total_steps": self.total_steps, "world_size": self.ctx.world_size,
                                                     "trainer": self.trainer, "time": time.time(), "pid": os.getpid()})

    def budget_fraction(self) -> float:
        """How much of the wall-clock / money budget is spent, counting the time kept for the end
        (elapsed + reserve) / limit, in [0, 1]; 0 without a budget. This rank's clock: agree on it
        (e.g. a max over ranks) before acting on it together (a schedule that follows the budget)."""
        limit = self.stopper.budget.limit_s()
        if not limit:
            return 0.0
        return min(1.0, (self.stopper.elapsed_s() + self.stopper.reserve_s) / limit)

    # ---- cadence -------------------------------------------------------------------------------
    def should_log(self, step: int) -> bool:
        return step % self.cfg.log_every == 0 or step == self.total_steps

    def should_eval(self, step: int, end_of_epoch: bool = False) -> bool:
        due = end_of_epoch if self.eval_every == 0 else step % self.eval_every == 0
        return due or step == self.total_steps

    @contextlib.contextmanager
    def timing(self, phase: str):
        """Time spent here is reported under `phase` and left out of the step throughput."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self._clock.phases[phase] = self._clock.phases.get(phase, 0.0) + dt
            self._clock.excluded_in_window += dt
            if phase == "evaluation":
                self._slowest["evaluation"] = max(self._slowest["evaluation"], dt)
                self._update_reserve()

    # ---- per step ------------------------------------------------------------------------------
    def log_train(self, step: int, values: dict) -> None:
        """Record this step's training metrics; written by `step_done` with the window's throughput."""
        self._pending_log = (step, dict(values))
        loss = next((v for k, v in values.items() if "loss" in k or "fraction" in k), None)
        if isinstance(loss, float):
            self.bar.set_postfix({self.metric_name: f"{loss:.4f}"})

    def evaluated(self, step: int, metric: float, initial: bool = False) -> bool:
        """A validation result (lower is better, the same on every rank). `initial` marks the
        untrained model's value, the point "it learns" is measured from. Returns True when best."""
        if initial:
            self.initial_metric = metric
            self.metrics.log(step, "val", {self.metric_name: metric, "initial": True})
            self.log.info("step %d: val %s %.5f (untrained)", step, self.metric_name, metric)
            return False
        improved = self.early.update(metric)
        self.last_metric = metric
        if improved:
            self.best_step = step
        self.metrics.log(step, "val", {self.metric_name: metric, "best": self.early.best, "improved": improved})
        self.log.info("step %d: val %s %.5f%s", step, self.metric_name, metric,
                      " (best)" if improved else f" ({self.early.bad_evals} without improvement)")
        if self.early.should_stop:
            self.stopper.request(StopReason.EARLY_STOP)
        self._metric_to_save = (step, metric)
        return improved

    def step_done(self, step: int, position: dict, items: int = 0) -> StopReason:
        """Collective, once per optimizer step: throughput window, checkpoint cadence, the agreed stop
        (saving exactly once on a stop). `position` is this rank's data position after `step`;
        `items` the samples (tokens, graphs...) all ranks trained on in it."""
        self.step = step
        clock = self._clock
        clock.window_items += items
        clock.window_steps += 1
        clock.items_this_attempt += items
        self.bar.update(1)
        maybe_inject(self.ctx.rank, step, self.ctx.restart_count)
        if self._pending_log is not None:
            self._close_window(step)
        self._heartbeat(step)
        evaluated_now = self._metric_to_save is not None and self._metric_to_save[0] == step
        reason, time_save = self._agree(step, force=evaluated_now or step % self.cfg.ckpt_every == 0)
        if self._metric_to_save is not None and self._metric_to_save[0] == step:
            self._save(step, position, self._metric_to_save[1])
        elif step % self.cfg.ckpt_every == 0 or time_save:
            self._save(step, position, None)
        if reason == StopReason.NONE and self.total_steps is not None and step >= self.total_steps:
            reason = StopReason.COMPLETED
        if reason != StopReason.NONE and self._last_saved_step != step:
            self._save(step, position, None)
        if reason != StopReason.NONE:
            self._settle()  # the loop ends: its last checkpoint is complete before anything else runs
        self.reason = reason
        return reason

    def _agree(self, step: int, force: bool) -> tuple[StopReason, bool]:
        """The stop agreement, every step or every N (each is a collective and, on a GPU, a host
        sync). Which steps agree is decided identically on every rank: a fixed N, or N agreed at the
        previous agreement (the max of every rank's proposal: about AGREE_TARGET_S of steps), plus
        every evaluation and step-cadence checkpoint (so early stopping and saves stay exact).
        Rank 0's clock decides a time-based checkpoint; it rides on the same collective."""
        self._since_agree += 1
        last = self.total_steps is not None and step >= self.total_steps
        if not (force or last or self._since_agree >= self._agree_every):
            return StopReason.NONE, False
        every_min = getattr(self.cfg, "ckpt_every_min", None)
        time_due = bool(self.ctx.is_main and every_min and time.monotonic() - self._last_save_time >= every_min * 60)
        proposal = self._propose_agree_every()
        pending = self._pending
        writing = pending is not None and not pending.done()
        failed = pending is not None and not writing and pending.error is not None
        reason, (time_save, agreed_every, any_writing, any_failed) = self.stopper.agree_values(
            float(time_due), float(proposal), float(writing), float(failed))
        self._since_agree = 0
        self._agree_every = max(1, int(agreed_every))
        if pending is not None and any_failed:
            self._write_failed(pending)
        elif pending is not None and not any_writing:
            self._commit_pending()  # every rank's files are on disk: complete it (collective, agreed)
        return reason, time_save > 0

    def _propose_agree_every(self) -> int:
        setting = getattr(self.cfg, "agree_every", None)
        if setting is None:
            setting = 0 if self.ctx.device.type == "cuda" else 1
        if setting > 0:
            return setting
        clock = self._clock  # adaptive: about AGREE_TARGET_S of steady steps between agreements
        if clock.steady_steps == 0 or clock.steady_s <= 0:
            return 1
        per_step = clock.steady_s / clock.steady_steps
        return int(min(AGREE_MAX_STEPS, max(1, AGREE_TARGET_S / per_step)))

    def _close_window(self, step: int) -> None:
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)  # the window's kernels are done: honest time
        clock = self._clock
        now = time.perf_counter()
        seconds = max(now - clock.window_start - clock.excluded_in_window, 1e-9)
        if clock.windows_closed == 0:
            clock.first_window_s = seconds  # compile and warm-up: not steady state
        else:
            clock.steady_items += clock.window_items
            clock.steady_s += seconds
            clock.steady_steps += clock.window_steps
        clock.windows_closed += 1
        logged_step, values = self._pending_log
        per_s = clock.window_items / seconds
        values.update({f"{self.unit}_per_s": per_s, f"{self.unit}_per_s_per_device": per_s / self.ctx.world_size,
                       "step_time_s": seconds / max(clock.window_steps, 1),
                       "peak_memory_bytes": peak_memory_bytes(self.ctx.device)})
        mfu = self.mfu(per_s)
        if mfu is not None:
            values["mfu"] = mfu
        self.metrics.log(logged_step, "train", values)
        self._pending_log = None
        clock.window_start, clock.window_items, clock.window_steps, clock.excluded_in_window = now, 0, 0, 0.0

    def _save(self, step: int, position: dict, metric: float | None) -> None:
        self._settle()  # one write in flight at most (every rank saves at the same step: collective-safe)
        t0 = time.perf_counter()
        shared = {"states": {name: obj.state_dict() for name, obj in self.states.items()},
                  "run": {"step": step, "elapsed_s": self.stopper.elapsed_s(), "early_stopping": self.early.state_dict(),
                          "initial_metric": self.initial_metric, "last_metric": self.last_metric,
                          "best_step": self.best_step, "position_rank0": position}}
        rank_state = {"position": position, "rng": rng.capture(self.ctx.device)}
        meta = {"metric": metric, "metric_name": self.metric_name, "trainer": self.trainer,
                "config": cfgmod.to_dict(self.cfg)}
        if self.sharded_states:
            self.ckpt.save(step, shared, rank_state, meta, sharded=self.sharded_states)
        elif self._write_behind():
            snap = self._snapshot.take({"shared": shared if self.ctx.is_main else None, "rank": rank_state})
            self._pending = BackgroundWrite(step, meta, lambda: self.ckpt.write_local(step, snap["shared"], snap["rank"]))
        else:
            self.ckpt.save(step, shared, rank_state, meta)
        self._last_saved_step = step
        self._last_save_time = time.monotonic()
        self._heartbeat(step, force=True)
        dt = time.perf_counter() - t0
        self._slowest["checkpoint"] = max(self._slowest["checkpoint"], dt)
        self._update_reserve()
        self._clock.phases["checkpoint"] += dt
        self._clock.excluded_in_window += dt

    def _write_behind(self) -> bool:
        setting = getattr(self.cfg, "ckpt_async", None)
        return self.ctx.device.type == "cuda" if setting is None else bool(setting)

    def _settle(self) -> None:
        """Collective: wait for the checkpoint being written behind the loop, then complete it (or
        stop every rank with the failure). The wait is checkpoint time (the loop stands still)."""
        pending = self._pending
        if pending is None:
            return
        t0 = time.perf_counter()
        pending.wait()
        if all_reduce_max(self.ctx, [1.0 if pending.error is not None else 0.0])[0] > 0:
            self._write_failed(pending)
        self._commit_pending()
        dt = time.perf_counter() - t0
        self._clock.phases["checkpoint"] += dt
        self._clock.excluded_in_window += dt

    def _commit_pending(self) -> None:
        pending, self._pending = self._pending, None
        self.ckpt.commit(pending.step, pending.files, pending.meta)
        self._writes_behind_s += pending.seconds
        # a final save is waited for: the budget's reserve counts the whole write, not the copy
        self._slowest["checkpoint"] = max(self._slowest["checkpoint"], pending.seconds)
        self._update_reserve()

    def _write_failed(self, pending: BackgroundWrite) -> None:
        """Every rank stops here together (the failure came through a collective)."""
        self._pending = None
        steps = self.ckpt.complete_steps()
        where = f"this rank: {pending.error}" if pending.error is not None else "on another rank"
        raise RunFailed(f"writing the checkpoint of step {pending.step} failed ({where}); the newest complete "
                      f"checkpoint is {'step ' + str(steps[0]) if steps else 'none'}: fix the disk and run the same "
                      f"command to resume from it")

    # ---- the end -------------------------------------------------------------------------------
    def restore_best(self, names: tuple[str, ...] = ("model",)) -> int | None:
        """Collective. Load the best checkpoint (lowest validation metric; else the newest) into those
        states, after checking its SHA-256. Returns its step (None when there is no checkpoint)."""
        self._settle()
        steps = self.ckpt.complete_steps()
        if not steps:
            return None
        best = self.ckpt.best_step()
        step = steps[0] if best is None else best
        plain = [name for name in names if name not in self.sharded_states]
        if plain:
            saved = self.ckpt.load_verified(step, self.ctx.device)["states"]
            for name in plain:
                self.states[name].load_state_dict(saved[name])
        sharded = {name: self.sharded_states[name] for name in names if name in self.sharded_states}
        if sharded:
            self.ckpt.load_sharded(step, sharded)
        return step

    def throughput(self) -> dict:
        clock = self._clock
        wall = max(time.time() - self.started_at, 1e-9)
        steady = clock.steady_items / clock.steady_s if clock.steady_s > 0 else None
        if steady is None and clock.first_window_s:  # too short for a steady window: say so
            steady_note = "only the warm-up window was measured"
        else:
            steady_note = None
        accounted = (clock.first_window_s or 0.0) + clock.steady_s + sum(clock.phases.values())
        return {"unit": self.unit, "per_s_steady": steady,
                "per_s_per_device": steady / self.ctx.world_size if steady else None,
                "effective_per_s": clock.items_this_attempt / wall, "items_this_attempt": clock.items_this_attempt,
                "steady_steps": clock.steady_steps, "note": steady_note,
                "checkpoint_writes_behind_s": self._writes_behind_s,  # overlapped with training (--ckpt-async)
                "breakdown_s": {"startup": self.entered_at - self.started_at, "first_window": clock.first_window_s,
                                "steady_steps": clock.steady_s, **clock.phases,
                                "other": max(wall - accounted - (self.entered_at - self.started_at), 0.0),
                                "wall": wall}}

    def mfu(self, per_s: float | None) -> float | None:
        peak = peak_tflops(device_name(self.ctx.device)) if self.ctx.device.type == "cuda" else None
        if per_s is None or peak is None or not self.flops_per_item:
            return None
        return per_s * self.flops_per_item / (peak * 1e12 * self.ctx.world_size)

    def finish(self, summary: dict, evaluate: Callable[[], dict | None] | None = None) -> dict | None:
        """Collective. Write results.json (merged): the training section first, then the evaluation
        (skipped after a signal, with the command that runs it later)."""
        self._settle()
        if self.reason == StopReason.NONE:
            self.reason = StopReason.COMPLETED  # resumed at or past the last step
        self.log.info("training stopped: %s at step %d%s", self.reason.name.lower(), self.step,
                      f" ({self.signal_name})" if self.signal_name else "")
        summary = dict(summary)
        elapsed = self.stopper.elapsed_s()
        facts = run_facts(self.ctx, elapsed, self.cfg.budget(self.ctx.world_size).cost_usd(elapsed))
        throughput = self.throughput()
        training = {"stop_reason": self.reason.name.lower(), "signal": self.signal_name, "steps": self.step,
                    "total_steps": self.total_steps,
                    "best_val": {"name": f"val_{self.metric_name}", "value": self.early.best, "step": self.best_step},
                    "initial_val": self.initial_metric, "last_val": self.last_metric,
                    "throughput": throughput, "mfu": self.mfu(throughput["per_s_steady"]),
                    "wall_time_s_this_attempt": time.time() - self.started_at, **facts,
                    **summary.pop("training", {})}
        if self.reason == StopReason.SIGNAL:
            evaluation = {"skipped": f"stopped by {self.signal_name}; run `trainers {self.trainer} evaluate "
                                     f"--run-dir {self.run_dir}` for the metrics"}
        else:
            evaluation = {"pending": "the final evaluation was running when results were last written"}
        results = {"trainer": self.trainer, "config": cfgmod.to_dict(self.cfg), **summary, "training": training,
                   "evaluation": evaluation, "run": run_record()}
        merged = None
        if self.ctx.is_main:
            previous = read_results(self.run_dir, self.log.warning)
            export = previous.get("export")
            if export and export.get("checkpoint_step") != self.ckpt.best_step():
                results["export"] = dict(export, stale=f"trained further since; run `trainers {self.trainer} "
                                                       f"export --run-dir {self.run_dir}` again")
            merged = merge_results(self.run_dir, results, self.log.warning)
        if self.reason != StopReason.SIGNAL and evaluate is not None:
            with self.timing("evaluation"):
                evaluation = evaluate()
            if self.ctx.is_main:
                merged = merge_results(self.run_dir, {"evaluation": evaluation}, self.log.warning)
        if self.ctx.is_main:
            self.log.info("results: %s", self.run_dir / "results.json")
        barrier(self.ctx)
        return merged
