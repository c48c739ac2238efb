"""Train one LSTM direction model per symbol, many at once: every torchrun worker takes the next symbol
from the job queue and trains it on its own device in a run of its own.

    trainers lstm train --symbols AAPL,MSFT,BTC-USD            one process (CPU or one GPU)
    torchrun --nproc_per_node=8 -m trainers lstm train ...      8 workers, one per GPU
    torchrun --nproc_per_node=16 -m trainers lstm train --jobs-per-gpu 2 ...   2 workers share each GPU

No DDP: the models are independent. This file is one symbol's loop, the usual one on the run
boundary: build, `with Run(...)`, resume, a flat loop, `finish`, with a single-process context and
the symbol's own folder, so each symbol resumes on its own. The job around it (the queue, a
second try for a symbol that raised, stops published to every worker, the summary) is
trainers.lstm.worker, which gets `train_symbol` passed in.

Exit code: 0 when the queue ran out (or the job was stopped by a signal or budget) and nothing
failed. Run as one process, 1 when a symbol failed; under torchrun 0 even then (a non-zero exit
makes torchrun restart every worker for nothing, and stops deploy_8gpu.sh before the symbols that
did succeed are exported): the summary and the last log line count the failures.
"""

from __future__ import annotations

import signal
import time

import torch

from trainers.lstm.build import build_model
from trainers.lstm.cohort import train_cohort
from trainers.lstm.config import LstmConfig
from trainers.lstm.evaluate import evaluate_symbol, log_symbol_summary, validation_loss
from trainers.lstm.features import SymbolData
from trainers.lstm.job import planned_steps
from trainers.lstm.model import count_parameters, direction_loss
from trainers.lstm.worker import SymbolOutcome, Worker, close_job_logger, run_job
from trainers.runtime.budget import StopReason
from trainers.runtime.dist import distributed
from trainers.runtime.logs import close_handlers
from trainers.runtime.run import Run
from trainers.runtime.rundir import single_process_context
from trainers.runtime.sampling import EpochCursor
from trainers.runtime.stops import HANDLED_SIGNALS


def train(cfg: LstmConfig) -> int:
    started_at = time.time()
    cfg.validate()
    handlers = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}
    try:
        # A gloo group on the CPU, whatever the device: it carries one broadcast (the attempt's queue);
        # NCCL would refuse two workers on one GPU (--jobs-per-gpu).
        with distributed("cpu", cfg.collective_timeout_s) as ctx:
            try:
                return run_job(cfg, ctx, started_at, train_symbol, train_cohort)
            finally:
                close_job_logger(ctx.rank)
    finally:
        for sig, handler in handlers.items():  # a caller in-process (tests) gets its own handlers back
            signal.signal(sig, handler)


def train_symbol(cfg: LstmConfig, data: SymbolData, worker: Worker, attempt: int) -> SymbolOutcome:
    """One symbol's flat loop on the run boundary (its own folder, single-process context)."""
    device = worker.device
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, data.n_features).to(device)  # the features this symbol's data allows
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    data.to(device)
    train_ids = data.ids["train"]
    total_steps = planned_steps(cfg, len(train_ids))
    pos_weight = torch.tensor(data.pos_weight, device=device)
    symbol = data.symbol

    with Run(worker.once(cfg), single_process_context(str(device)), "lstm", {"model": model, "optimizer": optimizer},
             total_steps, unit="samples", metric_name="loss", eval_every=cfg.eval_every) as run:
        worker.hear_signals_inside()
        worker.quiet_console(run.log)
        if worker.world_size > 1:  # one progress bar per worker would interleave on the terminal
            run.quiet_progress()
        run.log.info("lstm %s: %s parameters on %s; %s", symbol, f"{count_parameters(model):,}", device,
                     ", ".join(f"{k} {v}" for k, v in data.info()["samples"].items()))
        start = run.resume()
        if start.resumed:
            worker.log.info("%s: resumed from checkpoint step %d", symbol, start.step)
        cursor = EpochCursor(len(train_ids), 1, 0, cfg.batch_size, cfg.seed, device=device,
                             **EpochCursor.start(start.position))
        if not start.resumed:
            run.evaluated(0, validation_loss(model, data, cfg.eval_batch_size), initial=True)

        step = start.step
        worker.wind_down.started(time.perf_counter(), int(step < total_steps and not start.ended))
        window_loss = torch.zeros((), device=device)  # summed on the device, read at log points
        window_count = 0
        model.train()
        step_seconds = 0.0  # host time in the steps: the job's share outside them is what per-symbol work costs
        final_save_seconds = 0.0  # the last step_done (the final checkpoint): part of the symbol's end
        worker.wind_down.training, worker.wind_down.to_export = 1, 0  # what a budget stop would end
        while step < total_steps and not start.ended:
            stepping = time.perf_counter()
            positions, count = cursor.batch()
            x, y = data.gather(train_ids[positions])  # positions on the device already: no copy per step
            loss = direction_loss(model(x), y, pos_weight)  # BCE on the logit: the model has no sigmoid
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            step_seconds += time.perf_counter() - stepping
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
            worker.wind_down.finishing = int(step >= total_steps)  # (its export comes next unless stopped now)
            worker.after_step(run, symbol, step, attempt)  # the job's stops and budget, the tests' raise hook
            saving = time.perf_counter()
            if run.step_done(step, cursor.position(), count, loss=loss.detach()) != StopReason.NONE:
                final_save_seconds = time.perf_counter() - saving
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
        finishing = time.perf_counter()
        results = run.finish(summary, evaluate=evaluate)
        worker.wind_down.ended(final_save_seconds + time.perf_counter() - finishing)
    close_handlers(run.log)  # its training.log closed: a worker opens hundreds of runs
    return SymbolOutcome(run.reason, run.signal_name, run.step, results, step_seconds)
