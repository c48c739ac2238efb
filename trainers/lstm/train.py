"""Train one LSTM direction model per symbol, many at once: every torchrun worker takes the next symbol
from the job queue (trainers.lstm.queue) and trains it on its own device in a run of its own.

    trainers lstm train --symbols AAPL,MSFT,BTC-USD            one process (CPU or one GPU)
    torchrun --nproc_per_node=8 -m trainers lstm train ...      8 workers, one per GPU
    torchrun --nproc_per_node=16 -m trainers lstm train --jobs-per-gpu 2 ...   2 workers share each GPU

No DDP: the models are independent. Each symbol's loop is the usual one on the run boundary
(build, `with Run(...)`, resume, a flat loop, `finish`) with a single-process context and its own
folder, so it resumes on its own. A symbol that raises is tried once more (from its last
checkpoint), then recorded as failed with its error while the others go on. A signal or the job's
budget stops every worker's current symbol at the next step with a checkpoint.

Exit code: 0 when the queue ran out (or the job was stopped by a signal or budget) and nothing
failed. Run as one process, 1 when a symbol failed; under torchrun 0 even then (a non-zero exit
makes torchrun restart every worker for nothing, and stops deploy_8gpu.sh before the symbols that
did succeed are exported): the summary and the last log line count the failures.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from trainers.errors import CheckPassed, UsageError
from trainers.lstm import queue as jobqueue
from trainers.lstm.build import build_model
from trainers.lstm.config import LstmConfig
from trainers.lstm.evaluate import evaluate_symbol, log_symbol_summary, validation_loss
from trainers.lstm.export import export_symbol
from trainers.lstm.features import SymbolData, build_symbol_data
from trainers.lstm.job import JobPlan, fix_date_range, planned_steps, prepare_job, symbol_config, symbol_dir
from trainers.lstm.model import count_parameters, direction_loss
from trainers.lstm.summary import write_job_summary
from trainers.runtime import config as cfgmod
from trainers.runtime.budget import Budget, StopReason
from trainers.runtime.dist import DistContext, broadcast_object, distributed, pick_device
from trainers.runtime.faults import maybe_inject
from trainers.runtime.files import atomic_write_json
from trainers.runtime.results import read_results
from trainers.runtime.run import Run
from trainers.runtime.rundir import single_process_context
from trainers.runtime.sampling import EpochCursor

SUMMARY_EVERY_S = 30.0  # rank 0 rewrites the job's summary at most this often while it trains
FAIL_ENV = "TRAINERS_LSTM_FAIL"  # tests: "SYN001:always,SYN002:once" makes those symbols raise at step 2


@dataclass
class SymbolOutcome:
    reason: StopReason
    signal: str | None
    steps: int
    results: dict | None


class Worker:
    """One torchrun worker: its rank, device, the queue, the job's clock and budget, its log."""

    def __init__(self, cfg: LstmConfig, ctx: DistContext, device: torch.device, log: logging.Logger,
                 queue: jobqueue.JobQueue, attempt: dict):
        self.cfg = cfg
        self.rank = ctx.rank
        self.world_size = ctx.world_size
        self.device = device
        self.log = log
        self.queue = queue
        self.attempt = attempt
        self.restart = ctx.restart_count
        self.budget = Budget(cfg.max_hours, cfg.budget_usd, cfg.usd_per_gpu_hour, attempt["devices"])
        self.signalled: str | None = None  # a signal this process got (between symbols or inside one)
        self.inject_fault = _fault_is_mine(ctx.rank)
        self.failures = _failures_wanted()

    def elapsed_s(self) -> float:
        return self.attempt["elapsed_before_s"] + time.time() - self.attempt["started_at"]

    def install_signal_handlers(self) -> None:
        """Between symbols (data, export, the wait at the end) a signal only sets a flag; inside a
        symbol's run the run's own handler takes over and gives this one back after."""
        def on_signal(signum, _frame):
            self.signalled = signal.Signals(signum).name
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)

    def hear_signals_inside(self) -> None:
        """Inside a symbol's run the run's handler takes the signal; chain this worker's flag to it, so
        an error raised while the job is being stopped is not mistaken for the symbol's failure."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            run_handler = signal.getsignal(sig)

            def both(signum, frame, run_handler=run_handler):
                self.signalled = signal.Signals(signum).name
                if callable(run_handler):
                    run_handler(signum, frame)
            signal.signal(sig, both)

    def stopping(self) -> bool:
        return self.signalled is not None or self.queue.stop_record(force=True) is not None

    def publish_stop(self, reason: str, symbol: str | None, step: int | None, signal_name: str | None) -> dict:
        mine = {"reason": reason, "signal": signal_name, "worker": self.rank, "symbol": symbol, "step": step}
        record = self.queue.request_stop(mine)
        if record == mine:
            self.log.info("stopping the job: %s%s%s", reason, f" ({signal_name})" if signal_name else "",
                          f" at {symbol} step {step}" if symbol else "")
        return record

    def after_step(self, run: Run, symbol: str, step: int, attempt: int) -> None:
        """Between a symbol's optimizer step and its step_done: faults for the tests, the job's
        budget, and stops published by other workers."""
        if self.inject_fault:
            maybe_inject(self.rank, step, self.restart)
        if step == 2 and self.failures.get(symbol) in ("always", "once" if attempt == 1 else None):
            raise RuntimeError(f"{FAIL_ENV} asked {symbol} to fail at step 2 (try {attempt})")
        if self.signalled is not None and self.queue.stop_record() is None:
            self.publish_stop("signal", symbol, step, self.signalled)  # this process got it: tell the others
        record = self.queue.stop_record()
        if record is None:
            over = self.budget.exceeded(self.elapsed_s())
            if over != StopReason.NONE:
                record = self.publish_stop(over.name.lower(), symbol, step, None)
        if record is not None:
            if record["reason"] == "signal":
                run.request_stop(StopReason.SIGNAL, f"{record['signal']} (received by worker {record['worker']})")
            else:
                run.request_stop(StopReason[record["reason"].upper()])


def _fault_is_mine(rank: int) -> bool:
    """TRAINERS_FAULT names a worker rank. Inside each symbol's run the rank is 0 (a single-process
    context), so the run's own injection would fire in every worker: take the variable away from the
    workers it does not name, and let the named one inject itself (the run's call does it for rank 0)."""
    spec = os.environ.get("TRAINERS_FAULT")
    m = re.match(r"^(sigkill|sigterm)@rank(\d+):step(\d+)$", spec or "")
    if m is None:
        return False
    if int(m.group(2)) != rank:
        os.environ.pop("TRAINERS_FAULT")
        return False
    return rank != 0


def _failures_wanted() -> dict[str, str]:
    spec = os.environ.get(FAIL_ENV, "")
    return dict(part.split(":", 1) for part in spec.split(",") if ":" in part)


def train_symbol(cfg: LstmConfig, data: SymbolData, worker: Worker, attempt: int) -> SymbolOutcome:
    """One symbol's flat loop on the run boundary (its own folder, single-process context)."""
    device = worker.device
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, data.n_features).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    data.to(device)
    train_ids = data.ids["train"]
    total_steps = planned_steps(cfg, len(train_ids))
    pos_weight = torch.tensor(data.pos_weight, device=device)
    symbol = data.symbol

    with Run(cfg, single_process_context(str(device)), "lstm", {"model": model, "optimizer": optimizer}, total_steps,
             unit="samples", metric_name="loss", eval_every=cfg.eval_every) as run:
        worker.hear_signals_inside()
        for handler in run.log.handlers:  # the job log speaks for the workers; the symbol's own log keeps all
            if type(handler) is logging.StreamHandler:
                handler.setLevel(logging.WARNING)
        if worker.world_size > 1:  # one progress bar per worker would interleave on the terminal
            run.quiet_progress()
        run.log.info("lstm %s: %s parameters on %s; %s", symbol, f"{count_parameters(model):,}", device,
                     ", ".join(f"{k} {v}" for k, v in data.info()["samples"].items()))
        start = run.resume()
        if start.resumed:
            worker.log.info("%s: resumed from checkpoint step %d", symbol, start.step)
        cursor = EpochCursor(len(train_ids), 1, 0, cfg.batch_size, cfg.seed, **EpochCursor.start(start.position))
        if not start.resumed:
            run.evaluated(0, validation_loss(model, data, cfg.eval_batch_size), initial=True)

        step = start.step
        window_loss = torch.zeros((), device=device)
        window_count = 0
        model.train()
        while step < total_steps:
            positions, count = cursor.batch()
            x, y = data.gather(train_ids[positions.to(device)])
            loss = direction_loss(model(x), y, pos_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            step += 1
            window_loss += loss.detach() * count
            window_count += count
            end_of_epoch = cursor.advance()

            if run.should_log(step):
                run.log_train(step, {"loss": float(window_loss) / window_count, "epoch": cursor.epoch})
                window_loss.zero_()
                window_count = 0
            if run.should_eval(step, end_of_epoch):
                with run.timing("evaluation"):
                    run.evaluated(step, validation_loss(model, data, cfg.eval_batch_size))
            worker.after_step(run, symbol, step, attempt)
            if run.step_done(step, cursor.position(), count) != StopReason.NONE:
                break

        def evaluate() -> dict:
            best = run.restore_best()
            evaluation = evaluate_symbol(model, data, cfg.eval_batch_size, cfg.cost_bps, cfg.calibration_bins)
            evaluation["checkpoint_step"] = best
            log_symbol_summary(run.log, symbol, evaluation)
            return evaluation

        summary = {"data": data.info(), "preprocessing": data.preprocessing(),
                   "model": {"n_features": data.n_features, "hidden": cfg.hidden, "layers": cfg.layers,
                             "parameters": count_parameters(model)},
                   "training": {"epoch": cursor.epoch, "steps_per_epoch": cursor.steps_per_epoch,
                                "pos_weight": data.pos_weight, "worker": worker.rank, "try": attempt}}
        results = run.finish(summary, evaluate=evaluate)
    for handler in list(run.log.handlers):
        handler.close()
    return SymbolOutcome(run.reason, run.signal_name, run.step, results)


def work_on(symbol: str, cfg: LstmConfig, plan: JobPlan, worker: Worker) -> SymbolOutcome | None:
    """Train `symbol` (a second try after an error), export it, write its done marker. Returns the
    outcome, or None when it failed twice."""
    started = time.perf_counter()
    scfg = symbol_config(cfg, symbol)
    folder = symbol_dir(Path(cfg.run_dir), symbol)
    for attempt in (1, 2):
        try:
            cfgmod.check_run_dir_compatible(folder, scfg)
            data = build_symbol_data(plan.bars[symbol], scfg, plan.timeframes)
            outcome = train_symbol(scfg, data, worker, attempt)
            break
        except Exception as exc:  # noqa: BLE001 - any error of one symbol must not stop the others
            error = f"{type(exc).__name__}: {exc}"
            if worker.stopping():  # e.g. the terminal's pipe closed with the SIGTERM: not the symbol's fault
                worker.log.warning("%s: %s while the job was stopping; not counted as a failure, a new run "
                                   "resumes it", symbol, error)
                return SymbolOutcome(StopReason.SIGNAL, None, 0, None)
            if attempt == 1:
                worker.log.warning("%s: try 1 failed (%s); trying again from its last checkpoint", symbol, error)
                continue
            worker.log.error("%s: failed twice (%s); recorded, going on with the other symbols", symbol, error)
            folder.mkdir(parents=True, exist_ok=True)
            jobqueue.write_marker(folder, _marker(worker, symbol, "failed", attempt, started,
                                                 error=error, traceback=traceback.format_exc()[-4000:]))
            return None
    if outcome.reason in (StopReason.SIGNAL, StopReason.TIME_BUDGET, StopReason.MONEY_BUDGET):
        worker.log.info("%s: stopped at step %d (%s); a new run resumes it", symbol, outcome.steps,
                        outcome.reason.name.lower())
        return outcome
    marker = _marker(worker, symbol, "ok", attempt, started, steps=outcome.steps,
                     stop_reason=outcome.reason.name.lower())
    if cfg.export:
        try:
            info = export_symbol(folder)
            marker["export"] = {"sha256": info["sha256"], "max_abs_error": info["parity"]["max_abs_error"]}
        except Exception as exc:  # noqa: BLE001 - the model trained; `trainers lstm export` can try again
            marker["export_error"] = f"{type(exc).__name__}: {exc}"
            worker.log.warning("%s: export failed (%s)", symbol, marker["export_error"])
    marker["seconds"] = time.perf_counter() - started
    jobqueue.write_marker(folder, marker)
    test = (outcome.results or {}).get("evaluation", {}).get("test", {})
    worker.log.info("%s: done in %.1f s on %s, %d steps, best val loss %s; test %s", symbol, marker["seconds"],
                    worker.device, outcome.steps, _fmt((outcome.results or {}).get("training", {}).get("best_val", {})
                                                      .get("value")), test.get("skill", {}).get("verdict", "n/a"))
    return outcome


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _marker(worker: Worker, symbol: str, status: str, tries: int, started: float, **extra) -> dict:
    return {"status": status, "symbol": symbol, "worker": worker.rank, "device": str(worker.device), "tries": tries,
            "attempt_token": worker.queue.token, "restart": worker.restart,
            "seconds": time.perf_counter() - started,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}


def worker_device(cfg: LstmConfig, local_rank: int) -> torch.device:
    """Worker r of a node uses GPU r // jobs_per_gpu; on CPU every worker shares the CPU."""
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        if cfg.jobs_per_gpu > 1:
            raise UsageError(f"--jobs-per-gpu {cfg.jobs_per_gpu} packs workers onto GPUs; on CPU every worker "
                             f"shares the CPU: set their number with torchrun --nproc_per_node")
        return torch.device("cpu")
    index = local_rank // cfg.jobs_per_gpu
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible and index >= visible:
        raise UsageError(f"worker {local_rank} of this node would use GPU {index}, but {visible} are visible: start "
                         f"at most --jobs-per-gpu {cfg.jobs_per_gpu} x {visible} = {cfg.jobs_per_gpu * visible} "
                         f"workers per node")
    device = pick_device(index, cfg.device)
    torch.cuda.set_device(device)
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


def train(cfg: LstmConfig) -> int:
    started_at = time.time()
    cfg.validate()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # A gloo group on the CPU, whatever the device: it carries one broadcast (the attempt's queue);
        # NCCL would refuse two workers on one GPU (--jobs-per-gpu).
        with distributed("cpu", cfg.collective_timeout_s) as ctx:
            return run_job(cfg, ctx, started_at)
    finally:
        for sig, handler in handlers.items():  # a caller in-process (tests) gets its own handlers back
            signal.signal(sig, handler)
        for handler in logging.getLogger(f"trainers.lstm.worker{os.environ.get('RANK', '0')}").handlers:
            handler.close()


def run_job(cfg: LstmConfig, ctx: DistContext, started_at: float) -> int:
    # Everything that can reject the input happens before the first write into the job folder.
    job_dir = Path(cfg.run_dir)
    fix_date_range(cfg, cfgmod.saved_config(job_dir))
    cfgmod.check_run_dir_compatible(job_dir, cfg)
    device = worker_device(cfg, ctx.local_rank)
    plan = prepare_job(cfg, log=print if ctx.is_main else (lambda _msg: None))
    if os.environ.get("TRAINERS_CHECK_ONLY") == "1":
        # The deploy's check before torchrun: the job-level checks above are all a launch can fail
        # (each symbol's own checks ran in prepare_job). It must stop here, before the first write: a
        # symbol's run would raise CheckPassed inside work_on, whose per-symbol handler records it
        # as that symbol's failure.
        raise CheckPassed(f"lstm: every check before training passed for {job_dir} ({len(plan.symbols)} symbols)")

    devices = ctx.world_size // cfg.jobs_per_gpu if device.type == "cuda" else ctx.world_size
    attempt = None
    if ctx.is_main:
        (job_dir / "symbols").mkdir(parents=True, exist_ok=True)
        if not (job_dir / "config.json").exists():
            atomic_write_json(job_dir / "config.json", cfgmod.to_dict(cfg))
        # a new launch tries failed symbols again; a torchrun restart within one launch does not
        pending, counts = jobqueue.pending_symbols(job_dir, plan.symbols, retry_failed=ctx.restart_count == 0)
        previous = read_results(job_dir).get("training", {})
        attempt = {"token": uuid.uuid4().hex[:12], "pending": pending, "counts": counts, "started_at": started_at,
                   "elapsed_before_s": float(previous.get("elapsed_s_all_attempts") or 0.0), "devices": max(devices, 1)}
    attempt = broadcast_object(ctx, attempt)
    queue = jobqueue.JobQueue(jobqueue.open_store(ctx, cfg.collective_timeout_s), attempt["token"], attempt["pending"])
    log = job_logger(job_dir, ctx.rank, device)
    worker = Worker(cfg, ctx, device, log, queue, attempt)
    worker.install_signal_handlers()
    if ctx.is_main:
        log.info("lstm job: %d symbols (%d done, %d failed before, %d to train) on %d worker(s), %s%s; base %s, "
                 "timeframes %s", len(plan.symbols), attempt["counts"]["ok"], attempt["counts"]["failed"],
                 len(attempt["pending"]), ctx.world_size, device.type,
                 f", {cfg.jobs_per_gpu} per GPU" if device.type == "cuda" else "", plan.timeframes[0].label,
                 ",".join(t.label for t in plan.timeframes))

    def summary() -> dict:
        return write_job_summary(job_dir, cfg, plan, attempt, ctx, device, queue.stop_record(force=True), log)

    next_summary = time.monotonic() + SUMMARY_EVERY_S
    while True:
        if worker.signalled:
            worker.publish_stop("signal", None, None, worker.signalled)
        if queue.stop_record(force=True) is not None:
            break
        over = worker.budget.exceeded(worker.elapsed_s())
        if over != StopReason.NONE:  # no new symbol once the job's time or money is spent
            worker.publish_stop(over.name.lower(), None, None, None)
            break
        claim = queue.claim()
        if claim is None:
            break
        index, symbol = claim
        log.info("%s: claimed (%d of %d pending)", symbol, index + 1, len(queue.pending))
        outcome = work_on(symbol, cfg, plan, worker)
        if worker.signalled is not None and queue.stop_record(force=True) is None:  # as a rule published at
            worker.publish_stop("signal", symbol, outcome.steps if outcome else None, worker.signalled)  # the step
        if ctx.is_main and time.monotonic() >= next_summary:  # progress for whoever watches results.md;
            summary()  # by the clock: rebuilding it reads every symbol's folder
            next_summary = time.monotonic() + SUMMARY_EVERY_S

    queue.worker_done()
    if not ctx.is_main:
        return 0
    signalled = worker.signalled is not None
    done = queue.wait_for_workers(ctx.world_size, time.monotonic() + jobqueue.GRACE_S if signalled else None)
    if done < ctx.world_size:
        log.warning("%d of %d workers did not finish within %.0f s of the signal; the summary shows what is on disk",
                    ctx.world_size - done, ctx.world_size, jobqueue.GRACE_S)
    results = summary()
    counts = results["training"]["symbols"]
    log.info("lstm: %d of %d symbols succeeded, %d failed, %d stopped, %d pending; stop reason %s; %s",
             counts["ok"], len(plan.symbols), counts["failed"], counts["stopped"], counts["pending"],
             results["training"]["stop_reason"], job_dir / "results.md")
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    return 1 if counts["failed"] and not under_torchrun else 0
