"""The job side of `trainers lstm train`: every torchrun worker claims symbols from the job queue
(trainers.lstm.queue) and hands them to the training loop (trainers.lstm.cohort.train_cohort, passed in:
this module never imports the loop, which imports the worker): a claim's symbols of one model shape as a cohort, a
symbol alone as a cohort of one. What a failed try becomes is trainers.lstm.recovery's table; the marker files
are trainers.lstm.markers'; the worker's state is trainers.lstm.worker's.

    run_job      checks, the attempt's pending list (rank 0, broadcast), claims until the queue is
                 empty or the job stops; rank 0 waits for the others and writes the summary
    work_on      one symbol alone: its training (a second try after an error), its export, its done marker
    work_on_cohort  the symbols of one claim trained together (`--cohort`), each then finished as
                 work_on finishes one; a symbol that raised in the cohort is tried again alone

A symbol that raises is tried once more (from its last checkpoint), then recorded as failed with its
error while the others go on. Except a CUDA error that breaks the process's context (an illegal memory
access, a device-side assert: every later call on the GPU fails in this process, so a second try and every
later symbol would fail and be recorded as failed, none by its own fault): the worker takes no more work, its
symbols stay pending, it stops the job as a signal would and exits 1, and torchrun's restart (the deploy's
--max-restarts) brings every worker back with a fresh context to resume them (DeviceLost).
"""

from __future__ import annotations

import gc
import logging
import os
import time
import traceback
import uuid
from pathlib import Path
from typing import Callable

import torch

from trainers.errors import first_line
from trainers.lstm import queue as jobqueue
from trainers.lstm.config import LstmConfig
from trainers.lstm.export import forget_exports
from trainers.lstm.export_behind import STALL_S, STOPPING_STALL_S, ExportsBehind, export_outcome, exports_behind
from trainers.lstm.features import SymbolData, build_symbol_data
from trainers.lstm.job import JobPlan, pin_dates, prepare_job, resolve, symbol_config, symbol_dir
from trainers.lstm.markers import check_not_a_symbol_folder, check_symbol_folders, mark_done, marker_of, remember_lost
from trainers.lstm.recovery import Recovery, Where, recovery
from trainers.lstm.size import cohort_size
from trainers.lstm.summary import not_exported, refresh_job_summary, summary_lock, write_job_summary
from trainers.lstm.worker import (
    STOPPED_UNFINISHED,
    DeviceLost,
    SymbolOutcome,
    TrainCohort,
    Worker,
    billed_devices,
    job_logger,
    worker_device,
)
from trainers.runtime import config as cfgmod
from trainers.runtime import device as device_mod
from trainers.runtime import faults
from trainers.runtime.budget import StopReason
from trainers.runtime.dist import DistContext, broadcast_object
from trainers.runtime.files import atomic_write_json
from trainers.runtime.logs import close_handlers, logger_name
from trainers.runtime.remote import start_mirror
from trainers.runtime.remote_pull import restore_from_remote
from trainers.runtime.results import read_results
from trainers.runtime.rundir import take_run_folder
from trainers.runtime.stops import Heard, heard_stop_signals

SUMMARY_EVERY_S = 30.0  # rank 0 rewrites the job's summary at most this often while it trains


def run_job(cfg: LstmConfig, ctx: DistContext, started_at: float, train_cohort: TrainCohort) -> int:
    # Everything that can reject the input happens before the first write into the job folder.
    job_dir = Path(cfg.run_dir)
    check_not_a_symbol_folder(job_dir)
    restore_from_remote(cfg.remote, job_dir, ctx, cfg, pin_dates)  # a fresh machine: the remote's job first
    cfg = resolve(cfg, job_dir)  # settled: read-only from here
    device = worker_device(cfg, ctx.local_rank)
    faults.raise_requests()  # a malformed test hook fails here, not as every symbol's error
    plan = prepare_job(cfg, log=print if ctx.is_main else (lambda _msg: None))
    check_symbol_folders(job_dir, plan.symbols)
    forget_exports()  # this job's first symbol is exported (and its latency measured) for this job's records
    # One job per folder, as for every trainer: rank 0 holds the job folder's lock for the job's life
    # (each symbol's run locks only its own folder, so a second job used to collide symbol by symbol,
    # marking the first one's symbols failed "in use" and training the others beside it). The
    # deploy's check-only start (TRAINERS_CHECK_ONLY=1) is refused by a held folder too, and stops
    # here with CheckPassed before the first write: past this point a symbol's run would raise it
    # inside work_on, whose per-symbol handler would record it as that symbol's failure.
    lock = take_run_folder(job_dir, ctx, "lstm", None)
    try:
        # --remote: the job's own files (config, summary, each symbol's done marker) mirrored beside the
        # symbols' runs, which mirror themselves to <remote>/symbols/<symbol>
        # (the signals held outside the mirror: its last upload, at the exit, is still a stop's, not a kill's)
        with heard_stop_signals() as heard, start_mirror(cfg.remote, job_dir, ctx, cfg) as mirror:
            return _attempt(cfg, ctx, started_at, train_cohort, plan, device, mirror, heard)
    finally:
        if lock is not None:
            lock.release()


def _attempt(cfg: LstmConfig, ctx: DistContext, started_at: float, train_cohort: TrainCohort, plan: JobPlan,
             device: torch.device, mirror, heard: Heard) -> int:
    """One torchrun attempt of the job, its folder locked: the pending list, the claims, the summary."""
    job_dir = Path(cfg.run_dir)
    devices = billed_devices(ctx.world_size, ctx.local_world_size, cfg.jobs_per_gpu, device)
    attempt = None
    if ctx.is_main:
        (job_dir / "symbols").mkdir(parents=True, exist_ok=True)
        if not (job_dir / "config.json").exists():
            atomic_write_json(job_dir / "config.json", cfgmod.to_dict(cfg))
        starting_over = cfg.restart and ctx.restart_count == 0  # (torchrun's restarts of this launch: not again)
        if starting_over:
            for symbol in plan.symbols:
                jobqueue.mark_restart(symbol_dir(job_dir, symbol))
        # a new launch tries failed symbols again; a torchrun restart within one launch does not
        pending, counts = jobqueue.pending_symbols(job_dir, plan.symbols, retry_failed=ctx.restart_count == 0)
        previous = read_results(job_dir).get("training", {})
        attempt = {"token": uuid.uuid4().hex[:12], "pending": pending, "counts": counts, "started_at": started_at,
                   "elapsed_before_s": 0.0 if starting_over else  # (--restart: a new budget)
                   float(previous.get("elapsed_s_all_attempts") or 0.0), "devices": max(devices, 1)}
    attempt = broadcast_object(ctx, attempt)
    queue = jobqueue.JobQueue(jobqueue.open_store(ctx, cfg.collective_timeout_s), attempt["token"], attempt["pending"])
    log = job_logger(job_dir, ctx.rank, device)
    worker = Worker(cfg, ctx, device, log, queue, attempt, heard)

    def summary() -> dict:
        started = time.perf_counter()
        written = write_job_summary(job_dir, cfg, plan, attempt, ctx, device, queue.stop_record(force=True), log)
        mirror.sync()
        worker.wind_down.summary_written(time.perf_counter() - started)
        return written

    if ctx.is_main:
        log.info("lstm job: %d symbols (%d done, %d failed before, %d to train) on %d worker(s), %s%s; base %s, "
                 "timeframes %s", len(plan.symbols), attempt["counts"]["ok"], attempt["counts"]["failed"],
                 len(attempt["pending"]), ctx.world_size, device.type,
                 f", {cfg.jobs_per_gpu} per GPU" if device.type == "cuda" else "", plan.timeframes[0].label,
                 ",".join(t.label for t in plan.timeframes))
        # What earlier attempts finished is summarised before anything else: an attempt killed
        # outright (SIGKILL to every process) writes nothing at its end.
        summary()
        if attempt["pending"] and worker.budget.exceeded(worker.elapsed_s()) != StopReason.NONE:  # (it stops at once,
            # saying why here)
            log.warning("lstm job: its budget is spent already (%.1f s of %.1f s: --max-hours and --budget-usd count "
                        "every run of the job); raise it to train the %d symbol(s) left", worker.elapsed_s(),
                        worker.budget.limit_s(), len(attempt["pending"]))

    cohort = cohort_size(cfg, plan.timeframes, device)
    if ctx.is_main and cohort > 1:
        log.info("lstm job: up to %d symbols at a time per worker, stacked into one model (--cohort)", cohort)
    if exports_behind(cfg.export_behind, device_mod.gpu_like(device, cfg.gpu_defaults), cfg.export):
        worker.exports = ExportsBehind(log)
    try:
        device_lost = _claim_until_done(cfg, ctx, plan, worker, cohort, train_cohort, summary)
        if worker.exports is not None:
            settle_exports(worker)
    finally:
        left = worker.exports.stop() if worker.exports is not None else []  # (the way out of an error)
        if left:
            log.warning("%d trained symbol(s) not exported when the worker stopped (%s); the next run finishes and "
                        "exports them", len(left), ", ".join(Path(f).name for f in left))

    queue.worker_done()
    if queue.lost:  # torchrun's agent is gone: no one hears this worker any more
        log.warning("the job's store is gone (%s): torchrun's agent died; stopped%s", queue.lost,
                    ", writing the summary of what is on disk" if ctx.is_main else "")
    if not ctx.is_main:
        if queue.lost:  # rank 0 cannot wait for this worker: what it finished after rank 0 read the folders is added
            refresh_job_summary(job_dir, plan.symbols, log, keep_stop=True)
        return 1 if device_lost else 0  # torchrun restarts the workers (with fresh contexts) on a non-zero exit
    signalled = worker.signalled is not None
    done = queue.wait_for_workers(ctx.world_size, time.monotonic() + jobqueue.GRACE_S if signalled else None)
    if done < ctx.world_size:
        log.warning("%d of %d workers did not report done%s; the summary shows what is on disk",
                    ctx.world_size - done, ctx.world_size,
                    f" within {jobqueue.GRACE_S:.0f} s of the signal" if signalled and not queue.lost else "")
    results = mirror.finish(cfg.remote_wait_s, summary(), results_lock=lambda: summary_lock(job_dir))
    counts = results["training"]["symbols_asked"]  # (the job's symbols from earlier launches are in the summary too)
    unexported = not_exported({s: results["symbols"][s] for s in plan.symbols})
    log.info("lstm: %d of %d symbols succeeded%s, %d failed, %d stopped, %d pending; stop reason %s; %s",
             counts["ok"], len(plan.symbols), f" ({len(unexported)} not exported: `trainers lstm export` tries "
             f"again)" if unexported else "", counts["failed"], counts["stopped"], counts["pending"],
             results["training"]["stop_reason"], job_dir / "results.md")
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ  # (symbols left pending by no stop: a failure that
    incomplete = results["training"]["stop_reason"] == "incomplete"  # could not be recorded, on any worker)
    return 1 if device_lost or ((counts["failed"] or incomplete) and not under_torchrun) else 0


def _claim_until_done(cfg: LstmConfig, ctx: DistContext, plan: JobPlan, worker: Worker, cohort: int,
                      train_cohort: TrainCohort, summary: Callable[[], dict]) -> DeviceLost | None:
    """The worker's claims, each trained and finished, until the queue is empty or the job stops; the broken CUDA
    context that stopped it, if one did."""
    job_dir, queue, log = Path(cfg.run_dir), worker.queue, worker.log
    next_summary = time.monotonic() + SUMMARY_EVERY_S
    with faults.as_worker(ctx.rank):
        while True:
            if worker.signalled:
                worker.publish_stop("signal", None, None, worker.signalled)
            if queue.stop_record(force=True) is not None:
                return None
            claims = claim_cohort(queue, min(cohort, worker.max_cohort or cohort), ctx.world_size)
            if not claims:  # (a job that trained everything past its budget was not stopped by it: its summary says
                return None  # how far past it is)
            worker.wind_down.claimed(time.perf_counter())
            over = worker.budget.exceeded(worker.elapsed_s())
            if over != StopReason.NONE:  # no new symbol once the job's time or money is spent (claimed, it stays
                worker.publish_stop(over.name.lower(), None, None, None, training=0)  # pending)
                return None
            over = worker.over_budget(len(claims), worker.wind_down.start_s(len(claims))) \
                if worker.wind_down.measured else StopReason.NONE
            if over != StopReason.NONE:  # nor one whose start and ends, as measured, would not fit
                worker.publish_stop(over.name.lower(), None, None, None, training=len(claims))
                return None
            for index, symbol in claims:
                log.info("%s: claimed (%d of %d pending)%s", symbol, index + 1, len(queue.pending),
                         f" in a cohort of {len(claims)}" if len(claims) > 1 else "")
                try:
                    jobqueue.set_aside_marker(symbol_dir(job_dir, symbol))
                except OSError as exc:  # (its folder read-only): the retry goes on; a stop would show the old marker
                    log.warning("%s: its old done marker could not be set aside (%s)", symbol, first_line(exc))
            try:
                if len(claims) == 1:
                    outcome = work_on(claims[0][1], cfg, plan, worker, train_cohort)
                else:
                    outcome = list(work_on_cohort([s for _, s in claims], cfg, plan, worker, train_cohort).values())[-1]
            except DeviceLost as lost:
                try:
                    failed = remember_lost(job_dir, lost, worker)
                except OSError as exc:  # (a full disk): the counts are lost, not the stop
                    failed = []
                    log.warning("the broken context could not be counted in the symbols' folders (%s)",
                                first_line(exc))
                exporting = list(worker.exports.waiting) if worker.exports is not None else []  # (any claim's)
                left = [s for _, s in claims if jobqueue.read_marker(symbol_dir(job_dir, s)) is None
                        and str(symbol_dir(job_dir, s)) not in exporting]
                behind = [Path(folder).name for folder in exporting]
                log.error("this worker's %s failed (%s): CUDA's context is broken and every later call on it fails "
                          "in this process; %s; the job stops with %s pending%s, and %s", worker.device, lost,
                          f"{', '.join(failed)} broke it alone for the second time and is recorded failed" if failed
                          else "no symbol is recorded failed (each is trained alone next time)",
                          ", ".join(left) or "none",
                          f" ({', '.join(behind)}: trained, marked done if its export ends, else left to the next "
                          f"run)" if behind else "", resumes_after_lost(ctx.restart_count))
                worker.publish_stop("signal", None, None, "a broken CUDA context")
                return lost
            if worker.exports is not None:  # the symbols whose export is over get their done markers
                worker.exports.collect(stopping=worker.stopping)
            if worker.signalled is not None and queue.stop_record(force=True) is None:  # as a rule published at
                worker.publish_stop("signal", claims[-1][1], outcome.steps if outcome else None,  # the step
                                    worker.signalled)
            if ctx.is_main and time.monotonic() >= next_summary:  # progress for whoever watches results.md;
                summary()  # by the clock: rebuilding it reads every symbol's folder
                next_summary = time.monotonic() + SUMMARY_EVERY_S


def claim_cohort(queue: jobqueue.JobQueue, size: int, world_size: int) -> list[tuple[int, str]]:
    """Up to `size` claims, one after another (each an atomic take from the queue), and never more than
    this worker's share of what was left at its first claim: the last symbols are spread over the
    workers, not piled on one."""
    claims: list[tuple[int, str]] = []
    while len(claims) < size:
        claim = queue.claim()
        if claim is None:
            break
        if not claims:
            size = min(size, -(-(len(queue.pending) - claim[0]) // world_size))
        claims.append(claim)
    return claims


def work_on(symbol: str, cfg: LstmConfig, plan: JobPlan, worker: Worker, train_cohort: TrainCohort,
            first_try: int = 1, note: dict | None = None) -> SymbolOutcome | None:
    """Train `symbol` (a second try after an error), export it, write its done marker. Returns the
    outcome, or None when it failed twice. (`first_try` 2: its first try failed in a cohort; `note`: what
    its marker says of why it was trained alone.)"""
    started = time.perf_counter()
    scfg = symbol_config(cfg, symbol)
    folder = symbol_dir(Path(cfg.run_dir), symbol)
    for attempt in range(first_try, 3):
        try:
            cfgmod.check_run_dir_compatible(folder, scfg)
            data = build_symbol_data(plan.bars[symbol], scfg, plan.timeframes)
            outcome = train_cohort(cfg, [data], worker, attempt)[symbol]  # a cohort of one: its own model
            if isinstance(outcome, BaseException):
                raise outcome
            break
        except Exception as exc:  # noqa: BLE001 - any error of one symbol must not stop the others
            close_handlers(logging.getLogger(logger_name(0, folder)))  # (its run's, if it opened before the error)
            action = recovery(exc, Where.ALONE, worker.stopping, worker.device, attempt)
            if action is Recovery.END_WORKER:
                raise DeviceLost([symbol], exc, alone=True) from None
            error = f"{type(exc).__name__}: {exc}"
            if action is Recovery.RESUME_LATER:
                worker.log.warning("%s: %s while the job was stopping; not counted as a failure, a new run "
                                   "resumes it", symbol, error)
                return SymbolOutcome(StopReason.SIGNAL, None, 0, None)
            if action is Recovery.AGAIN:
                worker.log.warning("%s: try 1 failed (%s); trying again from its last checkpoint", symbol, error)
                continue
            try:
                folder.mkdir(parents=True, exist_ok=True)
                jobqueue.write_marker(folder, marker_of(worker, symbol, "failed", attempt, started, **(note or {}),
                                                     error=error, traceback=traceback.format_exc()[-4000:]))
            except OSError as exc:  # (its folder is a file, or read-only): the failure cannot be recorded there
                worker.log.error("%s: failed twice (%s), and the failure could not be recorded in %s (%s); it stays "
                                 "pending, going on with the other symbols: fix that folder and run the same command",
                                 symbol, error, folder, first_line(exc))
                return None
            worker.log.error("%s: failed twice (%s); recorded, going on with the other symbols", symbol, error)
            return None
    outcome = finished(symbol, outcome, attempt, started, cfg, worker, note=note)
    worker.wind_down.handed_off()
    return outcome


def work_on_cohort(symbols: list[str], cfg: LstmConfig, plan: JobPlan, worker: Worker,
                   train_cohort: TrainCohort) -> dict[str, SymbolOutcome | None]:
    """Train `symbols` together (those of one model shape in one cohort), then finish each as work_on
    does. A symbol whose data or check fails goes to work_on (its own tries and failure record); one that
    raised inside the cohort is tried a second time alone, from its last checkpoint; when the cohort itself
    fails (Worker.one_at_a_time) or runs out of memory beyond smaller passes (Worker.smaller_cohorts), its
    members are each tried alone on a first try of their own."""
    started = time.perf_counter()
    outcomes: dict[str, SymbolOutcome | None] = {}
    shapes: dict[int, list[SymbolData]] = {}
    alone, again, suspects = [], [], []
    notes: dict[str, dict] = {}  # why a symbol is tried alone, for its marker (its cohort failed)
    for symbol in symbols:
        broken = jobqueue.times_lost(symbol_dir(Path(cfg.run_dir), symbol))
        if broken:  # a CUDA context broke while it trained: it may be the cause (remember_lost): alone, after the
            suspects.append((broken, symbol))  # others, the fewer times the sooner
            continue
        try:
            scfg = symbol_config(cfg, symbol)
            cfgmod.check_run_dir_compatible(symbol_dir(Path(cfg.run_dir), symbol), scfg)
            data = build_symbol_data(plan.bars[symbol], scfg, plan.timeframes)
        except Exception:  # noqa: BLE001 - work_on tries it again and records the failure
            alone.append(symbol)
            continue
        shapes.setdefault(data.n_features, []).append(data)
    for group in shapes.values():
        if len(group) == 1:
            alone.append(group[0].symbol)
            continue
        try:
            trained = train_cohort(cfg, group, worker, 1)
        except Exception as exc:  # noqa: BLE001 - the stack's own error (a member's is its outcome)
            action = recovery(exc, Where.STACK, worker.stopping, worker.device)
            if action is Recovery.END_WORKER:
                raise DeviceLost([data.symbol for data in group], exc, alone=False) from None
            if action is Recovery.RESUME_LATER:
                worker.log.warning("a cohort of %d symbols: %s: %s while the job was stopping; not counted as a "
                                   "failure, a new run resumes them", len(group), type(exc).__name__, first_line(exc))
                outcomes.update({data.symbol: SymbolOutcome(StopReason.SIGNAL, None, 0, None) for data in group})
                continue
            worker.one_at_a_time(len(group), exc)
            alone.extend(data.symbol for data in group)
            notes.update({data.symbol: {"cohort_failed": f"{type(exc).__name__}: {first_line(exc)}"} for data in group})
            continue
        lost = next((outcome for outcome in trained.values() if not isinstance(outcome, SymbolOutcome)
                     and device_mod.context_lost(outcome, worker.device)), None)  # (the table's END_WORKER, first)
        if lost is not None:  # the symbols that finished are finished; the others stay pending for a fresh context
            for symbol, outcome in trained.items():
                if isinstance(outcome, SymbolOutcome):
                    outcomes[symbol] = finished(symbol, outcome, 1, started, cfg, worker, len(group))
            raise DeviceLost([s for s, outcome in trained.items() if not isinstance(outcome, SymbolOutcome)],
                             lost, alone=False)
        for symbol, outcome in trained.items():
            # (the stop asked at each member's turn: one may come while the ones before it finish)
            action = None if isinstance(outcome, SymbolOutcome) else recovery(outcome, Where.MEMBER, worker.stopping)
            if action is None:
                outcomes[symbol] = finished(symbol, outcome, 1, started, cfg, worker, len(group))
            elif action is Recovery.RESUME_LATER:
                worker.log.warning("%s: %s while the job was stopping; not counted as a failure, a new run resumes "
                                   "it", symbol, f"{type(outcome).__name__}: {outcome}")
                outcomes[symbol] = SymbolOutcome(StopReason.SIGNAL, None, 0, None)
            elif action is Recovery.ALONE:  # out of memory: the cohort's (smaller_cohorts said so)
                alone.append(symbol)
            else:
                worker.log.warning("%s: try 1 failed in its cohort (%s: %s); trying again alone from its last "
                                   "checkpoint", symbol, type(outcome).__name__, outcome)
                again.append(symbol)
        worker.wind_down.handed_off()
    shapes.clear()  # the cohorts' data (on the device) and their last outcome are not kept for the tries alone
    data = group = outcome = None
    if worker.max_cohort is not None and alone:  # a cohort ran out of device memory or failed: its stack, held in
        gc.collect()  # reference cycles (member <-> run <-> cohort) until Python's collector runs, is freed for the
        device_mod.release_cached_memory(worker.device)  # tries alone now, and the allocator's cache given back
    suspects = [symbol for _, symbol in sorted(suspects, key=lambda suspect: suspect[0])]  # (stable: claim order)
    for symbol, first_try in [(s, 1) for s in alone] + [(s, 2) for s in again] + [(s, 1) for s in suspects]:
        if worker.stopping():  # a stopped job starts nothing new; the next run takes these up
            outcomes[symbol] = SymbolOutcome(StopReason.SIGNAL, None, 0, None)
            continue
        outcomes[symbol] = work_on(symbol, cfg, plan, worker, train_cohort, first_try, notes.get(symbol))
    return outcomes


def finished(symbol: str, outcome: SymbolOutcome, attempt: int, started: float, cfg: LstmConfig, worker: Worker,
             cohort: int = 1, note: dict | None = None) -> SymbolOutcome:
    """A trained symbol's end in the job: stopped (a new run resumes it), or exported and marked done (exporting
    behind the training: marked once its exporter is done with it). In a cohort of K its marker's `seconds` is its
    share of the worker's time (the cohort's span / K; the span itself is `cohort_seconds`; an export behind is not
    in it): the packing figures keep meaning how busy the workers were."""
    folder = symbol_dir(Path(cfg.run_dir), symbol)
    if outcome.reason in STOPPED_UNFINISHED:
        worker.log.info("%s: stopped at step %d (%s); a new run resumes it", symbol, outcome.steps,
                        outcome.reason.name.lower())
        return outcome
    marker = marker_of(worker, symbol, "ok", attempt, started, steps=outcome.steps, **(note or {}),
                     stop_reason=outcome.reason.name.lower(), step_seconds=outcome.step_seconds,
                     **({"phase_seconds": outcome.phase_seconds} if outcome.phase_seconds else {}))
    if worker.exports is not None:  # (only with --export)
        span = time.perf_counter() - started
        worker.exports.submit(folder, lambda exported: mark_done(symbol, outcome, marker, exported, span, cohort,
                                                                 worker))
    else:
        exporting = time.perf_counter()
        exported = export_outcome(folder) if cfg.export else {}
        if cfg.export:
            worker.wind_down.exported(time.perf_counter() - exporting)
        mark_done(symbol, outcome, marker, exported, time.perf_counter() - started, cohort, worker)
    return outcome


def settle_exports(worker: Worker) -> None:
    """The worker's loop is over: wait for its exports behind and mark their symbols done (an exporter with work
    silent for STALL_S is ended, its symbols recorded with an export error), unless this worker gets a signal (before
    or while it waits): then the exporter is ended, and the symbols it had not exported are left to the next run
    (which finishes and exports them). After a budget stop, another worker's, or a broken context, the exports are
    waited for while the exporter answers; silent for STOPPING_STALL_S then, it is ended and its symbols are left to
    the next run (a job whose time or money is spent does not wait STALL_S for it), and so while the job's budget
    is spent during this wait (a job that trained inside its budget, its exporter stuck)."""
    def stopping() -> bool:  # the job's budget counts this wait too: spent, it waits as a stopped job does
        return worker.stopping() or worker.budget.exceeded(worker.elapsed_s()) != StopReason.NONE

    left = worker.exports.settle(stop=lambda: worker.signalled is not None, stopping=stopping,
                                 stall_s=STALL_S, stopping_stall_s=STOPPING_STALL_S)
    if worker.signalled is not None and worker.queue.stop_record(force=True) is None:  # the summary says why
        worker.publish_stop("signal", None, None, worker.signalled)
    over = worker.budget.exceeded(worker.elapsed_s())
    unmarked = left or worker.exports.left_to_the_next_run  # (an exporter that ended as the job stopped: its own)
    if unmarked and over != StopReason.NONE and worker.queue.stop_record(force=True) is None:  # as for a signal
        worker.publish_stop(over.name.lower(), None, None, None, training=0)
    if left:
        worker.log.warning("%d trained symbol(s) stopped with the job before their export (%s); the next run "
                           "finishes and exports them", len(left), ", ".join(Path(f).name for f in left))


def resumes_after_lost(restart_count: int) -> str:
    """What resumes the job after this worker leaves on a broken context: torchrun's next restart (each worker in
    a fresh process, a fresh context), or, when none is left or without torchrun, the same command again."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return "running the same command again resumes"
    left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) - restart_count
    if left > 0:
        return f"torchrun's restart resumes with a fresh context ({left} restart{'s' if left > 1 else ''} left)"
    return "torchrun has no restart left (--max-restarts): running the same command again resumes"
