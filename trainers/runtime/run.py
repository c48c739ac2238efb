"""The run boundary: what every training loop calls at its edges. It owns no loop.

    with Run(cfg, ctx, RunSpec("forecast", states={"model": model, "optimizer": opt, ...}, total_steps=n)) as run:
        start = run.resume()                 # every state, this rank's RNG and its data position
        step = start.step
        while step < total_steps and not start.ended:      # ended: it had stopped early at that checkpoint
            ... one optimizer step ...; step += 1
            if run.should_log(step): run.log_train(step, {"loss": ...})
            if run.should_eval(step, end_of_epoch):
                with run.timing("evaluation"): run.evaluated(step, validation_loss(...))
            if run.step_done(step, position, items, loss) != StopReason.NONE: break
        return run.finish(summary, evaluate=...)

For every trainer alike: one job per folder, nothing written before every check passed; resume restores every state, the
counters and this rank's RNG and data position; `step_done` saves at the cadence and after each evaluation (with
--ckpt-at-eval improved each new best; held: kept in memory till the next write), agrees on a stop with every rank,
saves once on a stop, never after a non-finite loss; `finish` writes the training results, then the evaluation (skipped
after a signal or a failure). Its parts: `Checkpointer`, `StopAgreement`, `AgreementCadence`, `ValidationRecord`,
`FiniteWatch`, `ThroughputClock`, `StepLog`, the lock, `Heartbeat` and fingerprint (`rundir`), the mirror (`remote`).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable

from trainers.errors import RunEnded
from trainers.runtime import config as cfgmod
from trainers.runtime import device as device_mod
from trainers.runtime.checkpointer import Checkpointer, Start, WriteFailed
from trainers.runtime.dist import DistContext, barrier
from trainers.runtime.faults import maybe_inject
from trainers.runtime.info import run_facts
from trainers.runtime.logs import StepLog
from trainers.runtime.options import RunOptions
from trainers.runtime.remote import SIGNAL_WAIT_S, start_mirror
from trainers.runtime.results import ending, merge_results, run_record, write_training
from trainers.runtime.rundir import Heartbeat, open_run_dir, take_run_folder, undone_on_refusal
from trainers.runtime.spec import RunSpec
from trainers.runtime.stops import AgreementCadence, FiniteWatch, StopAgreement, StopReason, ValidationRecord
from trainers.runtime.throughput import ThroughputClock


class Run:
    def __init__(self, cfg: RunOptions, ctx: DistContext, spec: RunSpec):
        self.cfg, self.ctx, self.trainer = cfg.for_attempt(ctx.restart_count), ctx, spec.trainer  # (--restart: once)
        self.states, self.sharded_states = spec.states, spec.sharded_states
        self.metric_name, self.eval_every, self.data_fingerprint = spec.metric_name, spec.eval_every, spec.data_fingerprint
        self.total_steps, self.run_dir = spec.total_steps, Path(cfg.run_dir)
        self.clock = ThroughputClock(spec.unit, ctx.device, ctx.world_size, spec.flops_per_item,
                                     spec.started_at or time.time())
        self.budget_from = self.clock.started_at if spec.budget_includes_startup else None  # the budget counts from there
        self.step, self.reason, self._metric_to_save, self._exit = 0, StopReason.NONE, None, contextlib.ExitStack()

    def __enter__(self) -> "Run":
        with undone_on_refusal(self.run_dir, self.ctx, self._exit):  # (a remote refused: not even the lock's folder)
            lock = take_run_folder(self.run_dir, self.ctx, self.trainer, self.data_fingerprint, self.cfg.restart)
            self._exit.callback(lambda: lock is not None and lock.release())
            self.mirror = self._exit.enter_context(start_mirror(self.cfg.remote, self.run_dir, self.ctx, self.cfg))
        self.log, self.metrics = open_run_dir(self.run_dir, self.cfg, self.ctx, self.data_fingerprint, self.cfg.restart)
        self._exit.callback(self.metrics.close)
        gpu = device_mod.gpu_like(self.ctx.device, self.cfg.gpu_defaults)  # a GPU deploy's defaults, or rehearsed
        self._exit.enter_context(device_mod.deterministic_kernels(self.cfg.deterministic))  # before any step
        self.ckpt = Checkpointer.for_run(self.run_dir, self.ctx, self.cfg, self.log, gpu)
        self.mirror.attach(self.log, self.ckpt.manager)  # each commit uploaded behind the loop; the folder synced
        self.heartbeat = Heartbeat(self.run_dir, self.ctx, self.trainer, self.total_steps, self.mirror)
        self.val, self.finite = ValidationRecord(self.cfg.patience, self.cfg.min_delta), FiniteWatch()
        self.cadence = AgreementCadence(self.cfg.agree_every, gpu)
        self.stopper = StopAgreement(self.ctx, self.cfg.budget(self.ctx.world_size), counted_from=self.budget_from)
        self.steps = StepLog(self.metrics, self.total_steps, self.ctx.is_main, self.trainer, self.metric_name)
        self._exit.callback(self.steps.close)
        # last: nothing after it can raise, so a failed entry never leaves a listener holding the process's handler
        self._exit.callback(self.stopper.install_signal_handlers())  # (it returns their restore)
        self.clock.entered_at = time.time()
        return self

    def __exit__(self, *exc) -> None:
        self._exit.close()  # the lock, the metrics, the signal handlers, the bar

    signal_name = property(lambda self: self.stopper.signal_name)  # (str | None)

    def request_stop(self, reason: StopReason, signal_name: str | None = None) -> None:  # agreed at the next agreement
        self.stopper.request(reason, signal_name)

    def quiet_progress(self) -> None:  # no progress bar (several runs side by side would interleave on the terminal)
        self.steps.quiet()

    def resume(self, steps_left: Callable[[Start], int] | None = None) -> Start:
        """Collective: the newest checkpoint into `states`, the counters, this rank's RNG (fresh: seeded); Start.ended.
        `steps_left(start)`: the loop's steps from there, `total_steps` then (sampling.steps_left says why)."""
        if self.cfg.restart:  # its elapsed time is the old run's
            self.heartbeat.clear()
        start, saved = self.ckpt.resume(self.states, self.sharded_states, self.cfg.restart, self.cfg.seed, self.log)
        if saved is not None:
            self.stopper.elapsed_before_s = self.heartbeat.elapsed_including_lost_time(saved["elapsed_s"], self.log)
            self.val.load_state_dict(saved)
            if self.val.early.should_stop:  # (a killed evaluation or export, or a cohort's member before its done.json)
                start.ended, self.reason = True, StopReason.EARLY_STOP
        self.step = start.step
        if steps_left is not None:
            self.total_steps = self.heartbeat.total_steps = start.step + max(0, steps_left(start))
        self.steps.start(start.step, self.total_steps)
        self.clock.start()
        return start

    def should_log(self, step: int, also: bool = False) -> bool:  # also: where the loop logs besides the cadence
        return also or step % self.cfg.log_every == 0 or step == self.total_steps

    def should_eval(self, step: int, end_of_epoch: bool = False) -> bool:
        return (end_of_epoch if self.eval_every == 0 else step % self.eval_every == 0) or step == self.total_steps

    def timing(self, phase: str):  # time spent here is reported under `phase`, left out of the step throughput
        return self.clock.timing(phase, after=self._update_reserve)

    def log_train(self, step: int, values: dict) -> None:
        """Record this step's training metrics; written by `step_done` with the window's throughput."""
        self.steps.record(step, values)

    def evaluated(self, step: int, metric: float | None, initial: bool = False, improved: bool = False) -> bool:
        """A validation result (lower is better, the same on every rank); `initial`: the untrained model's. True when
        the best so far. None: a trainer that keeps its own bests (PPO's agents) says whether it `improved`."""
        if initial:
            self.val.untrained(step, metric, self.metric_name, self.log, self.metrics)
            return False
        if metric is not None:
            self.finite.watch(metric)
            improved = self.val.update(step, metric, self.metric_name, self.log, self.metrics)
            if self.val.early.should_stop:
                self.stopper.request(StopReason.EARLY_STOP)
        self._metric_to_save = (step, metric, improved or self.cfg.ckpt_at_eval == "always")
        return improved

    def step_done(self, step: int, position: dict, items: int = 0, loss=None) -> StopReason:
        """Collective, once per optimizer step: throughput window, checkpoint cadence, the agreed stop
        (saving exactly once on a stop). `position` is this rank's data position after `step`;
        `items` the samples (tokens, graphs...) all ranks trained on in it; `loss` this step's loss
        (a tensor stays on the device): a non-finite one stops every rank, nothing after it saved."""
        self.step = step
        self.clock.count(items)
        self.finite.watch(loss)
        maybe_inject(self.ctx.rank, step, self.ctx.restart_count)
        self.steps.step_ended(self.clock.close_window)
        self.heartbeat.beat(step, self.stopper.elapsed_s())
        if self.metrics.disk_full or self.heartbeat.disk_full:  # rank 0's writes: agreed like any stop
            self.stopper.request(StopReason.DISK_FULL)
        try:
            self.reason = self._agree_and_save(step, position)
        except WriteFailed as exc:  # every rank at once; a full disk ends the run, other failures raise
            if not exc.disk_full:
                raise
            self.log.error("%s", exc)
            self.reason = StopReason.DISK_FULL
        return self.reason

    def _agree_and_save(self, step: int, position: dict) -> StopReason:
        evaluated_now = self._metric_to_save is not None and self._metric_to_save[0] == step
        saves_eval = evaluated_now and self._metric_to_save[2]  # (its metric in the meta: `best` picks from those)
        reason, save_now, eval_only = self._agree(step, evaluated_now or self.ckpt.due_by_steps(step), saves_eval)
        if reason.failed:
            self.ckpt.settle_as_it_fails(self.log)  # the write in flight, or the best held: earlier, finite steps
            return reason
        if save_now or self.ckpt.due_by_steps(step):
            self._save(step, position, self._metric_to_save[1] if saves_eval else None, eval_only)
        if reason == StopReason.NONE and self.total_steps is not None and step >= self.total_steps:
            reason = StopReason.COMPLETED
        if reason != StopReason.NONE:
            if self.ckpt.last_saved_step != step:
                self._save(step, position, None)
            self._settle()  # the loop ends: its last checkpoint is complete before anything else runs
        return reason

    def _agree(self, step: int, force: bool, save: bool) -> tuple[StopReason, bool, bool]:
        """The stop agreement at the steps the cadence picks (on a GPU each is a host sync), always at an evaluation,
        a step-cadence save and the last step. On the same collective: whether to save now (rank 0's clock, or an
        evaluation that saves on any rank: is it that alone?), the adaptive cadence and a write behind the loop."""
        if not self.cadence.due(force or (self.total_steps is not None and step >= self.total_steps)):
            return StopReason.NONE, False, False
        if self.finite.host_diverged():
            self.stopper.request(StopReason.DIVERGED)
        writing, failure = self.ckpt.write_status()
        reason, (by_time, by_eval, every, any_writing, failure) = self.stopper.agree(
            float(self.ckpt.due_by_time()), float(save), float(self.cadence.proposal(self.clock.seconds_per_step())),
            writing, failure, diverged=self.finite.device_flag())
        self.cadence.agreed(every)
        self.ckpt.agreed(any_writing > 0, failure)
        self._update_reserve()
        return reason, by_time > 0 or by_eval > 0, by_eval > 0 and by_time == 0

    def _save(self, step: int, position: dict, metric: float | None, best_only: bool = False) -> None:
        shared = {"states": {name: obj.state_dict() for name, obj in self.states.items()},
                  "run": {"step": step, "elapsed_s": self.stopper.elapsed_s(), "position_rank0": position,
                          **self.val.state_dict()}}
        meta = {"metric": metric, "metric_name": self.metric_name, "trainer": self.trainer, "config": cfgmod.to_dict(self.cfg)}
        self.clock.exclude("checkpoint", self.ckpt.save(step, shared, position, meta, self.sharded_states, best_only))
        self.heartbeat.beat(step, self.stopper.elapsed_s(), force=self.ckpt.held_step != step)  # (held: no write)
        self._update_reserve()

    def _settle(self) -> None:  # the write behind the loop: wait for it and complete it
        self.clock.exclude("checkpoint", self.ckpt.settle())
        self._update_reserve()

    def _update_reserve(self) -> None:  # the end of a budget keeps time for the final save and evaluation
        self.stopper.keep_for_the_end(self.ckpt.slowest_s, self.clock.slowest["evaluation"])

    def restore_best(self, names: tuple[str, ...] = ("model",)) -> int | None:
        """Collective. The best checkpoint (else the newest) into the named states, verified; its step."""
        self._settle()
        return self.ckpt.restore_best(names, self.states, self.sharded_states)

    def throughput(self) -> dict:  # results.json's, so far
        return self.clock.summary(self.ckpt.writes_behind_s)

    def finish(self, summary: dict, evaluate: Callable[[], dict | None] | None = None) -> dict | None:
        """Collective. Write results.json (merged): the training section first, then the evaluation
        (skipped after a signal, with the command that runs it later, and after a failure). A run
        that diverged or filled the disk then raises RunEnded on every rank."""
        with contextlib.suppress(WriteFailed):
            self._settle()  # (its failure is already the reason)
        if self.reason == StopReason.NONE:
            self.reason = StopReason.COMPLETED  # resumed at or past the last step
        self.log.info("training stopped: %s at step %d%s", self.reason.name.lower(), self.step,
                      f" ({self.signal_name})" if self.signal_name else "")
        summary, elapsed, throughput = dict(summary), self.stopper.elapsed_s(), self.throughput()
        training = {"stop_reason": self.reason.name.lower(), "signal": self.signal_name, "steps": self.step,
                    "total_steps": self.total_steps, **self.val.summary(self.metric_name), "throughput": throughput,
                    "mfu": self.clock.mfu(throughput["per_s_steady"]), "deterministic": self.cfg.deterministic,
                    "wall_time_s_this_attempt": time.time() - self.clock.started_at, **self.stopper.decision(),
                    **run_facts(self.ctx, elapsed, self.cfg.budget(self.ctx.world_size).cost_usd(elapsed)),
                    **summary.pop("training", {})}
        ended = ending(self.reason, self.trainer, self.run_dir, self.signal_name, self.step,
                       self.ckpt.manager.complete_steps())
        merged = write_training(self.run_dir, {"trainer": self.trainer, "config": cfgmod.to_dict(self.cfg), **summary,
                                               "training": training, "run": run_record()}, self.trainer,
                                self.ckpt.manager.best_step(), ended, self.log) if self.ctx.is_main else None
        if ended is None and evaluate is not None:
            with self.timing("evaluation"):
                evaluation = evaluate()
            merged = merge_results(self.run_dir, {"evaluation": evaluation}, self.log.warning) if self.ctx.is_main \
                else None
        merged = self.mirror.finish(SIGNAL_WAIT_S if self.reason == StopReason.SIGNAL else self.cfg.remote_wait_s, merged)
        self.log.info("results: %s", self.run_dir / "results.json")  # (other ranks log warnings only)
        barrier(self.ctx)
        if self.reason.failed:
            raise RunEnded(ended)
        return merged
