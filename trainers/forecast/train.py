"""Train the S&P 500 return forecaster (seed 000) with DDP: build, resume, a flat loop, finish.

Each optimizer step takes this rank's share of a global batch (every sample once per epoch across
ranks), gathers the windows by index on the device, and normalises the loss by the global batch
count so uneven shards still give the exact mean gradient. Stops, checkpoints and results go
through the run boundary (trainers.runtime.run).

`--walk-forward K` runs that same loop once per fold, each a complete run of its own in
<run-dir>/fold_<k> (its own checkpoints, resume, results, report); this folder holds the config,
the per-fold table and mean +- std. A restart skips the folds that finished and resumes the one
that was running from its own checkpoints.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from trainers.forecast.build import build_model, model_flops
from trainers.forecast.config import PRESETS, ForecastConfig, refuse_steps_larger_than_the_split
from trainers.forecast.data import LoadedMarket, WindowStore, make_store, pin_dates, resolve
from trainers.forecast.evaluate import evaluate_splits, log_summary, validation_loss
from trainers.forecast.model import TrainStep, count_parameters
from trainers.forecast.report import write_report
from trainers.forecast.walk_forward import walk_forward
from trainers.runtime.dist import DistContext, all_reduce_sum, distributed, wrap_ddp
from trainers.runtime.precision import (
    autocast,
    build_adamw,
    compile_default,
    compile_facts,
    enable_tf32,
    make_grad_scaler,
    maybe_compile,
    precision_for,
)
from trainers.runtime.remote_pull import restore_from_remote
from trainers.runtime.results import read_results
from trainers.runtime.run import Run, RunSpec
from trainers.runtime.rundir import fingerprint_to_check
from trainers.runtime.sampling import EpochCursor, steps_left
from trainers.runtime.schedule import build_scheduler
from trainers.runtime.stops import StopReason


def model_text(cfg: ForecastConfig) -> str:
    """The model's options in words, for the log."""
    body = "no Transformer" if cfg.encoder == "none" else f"Transformer read out by {cfg.readout}"
    return ", ".join([body] + ["linear skip"] * cfg.linear_skip + ["past returns as input"] * cfg.past_returns)


def padded(ids: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`ids` padded to `size` (repeating its first id) and the weights that make the padding count
    for nothing: every micro-batch has one shape, so a compiled step never recompiles, and every
    sample is still trained on exactly once per epoch."""
    n = len(ids)
    weight = torch.ones(size, dtype=torch.float32, device=ids.device)
    if n == size:
        return ids, weight
    weight[n:] = 0.0
    return torch.cat([ids, ids[:1].expand(size - n)]), weight


def forward_backward(train_step: torch.nn.Module, store: WindowStore, ids: torch.Tensor, weight: torch.Tensor,
                     device: torch.device, precision, scaler, loss_scale: torch.Tensor) -> torch.Tensor:
    """One micro-batch: gather windows by index, forward + loss under autocast (one compiled graph
    when compiling), backward of the scaled weighted sum of squared errors (standardised target).
    Returns the unscaled SSE, detached, on the device (no host sync)."""
    x, y = store.gather(ids)
    y = (y - store.target_mean) / store.target_std
    with autocast(device, precision):
        loss, sse = train_step(x, y, weight, loss_scale)
    scaler.scale(loss).backward()
    return sse


def optimizer_step(model: torch.nn.Module, optimizer, scaler, grad_clip: float) -> None:
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def data_text(data_info: dict, store: WindowStore, target: str) -> str:
    """The log's line of what the run trains on."""
    left_out = "".join(f" ({f} left out: {why})" for f, why in data_info["features_left_out"].items())
    return (f"{data_info['source']}; {data_info['n_tickers']} tickers x {data_info['n_dates']} dates; samples "
            f"train/val/test {'/'.join(str(store.stats[s]) for s in ('train', 'val', 'test'))}; embargo "
            f"{store.plan.embargo} dates; label {target}; features {','.join(store.feature_names)}{left_out}")


def final_evaluation(run: Run, model: torch.nn.Module, store: WindowStore, ctx: DistContext,
                     cfg: ForecastConfig) -> dict | None:
    """Collective, at the run's end: the best checkpoint's splits scored beside the baselines, the report written
    (rank 0's evaluation; None on the others)."""
    best = run.restore_best()
    got = evaluate_splits(model, store, ctx, cfg.eval_batch_size, cfg.top_k, cfg.cost_bps, log=run.log)
    if not ctx.is_main:
        return None
    evaluation, series = got
    evaluation["checkpoint_step"] = best
    log_summary(run.log, evaluation)
    write_report(Path(cfg.run_dir), {**read_results(Path(cfg.run_dir)), "evaluation": evaluation}, series, run.log)
    return evaluation


def train(cfg: ForecastConfig) -> dict | None:
    started_at = time.time()
    cfg.validate()
    with distributed(cfg.device, cfg.collective_timeout_s) as ctx:
        if cfg.walk_forward and cfg.fold is None:
            return walk_forward(cfg, ctx, started_at, train_one)
        # Everything that can reject the input happens before the first write into the run folder.
        run_dir = Path(cfg.run_dir)
        restore_from_remote(cfg.remote, run_dir, ctx, cfg, pin_dates)  # a fresh machine: the remote's run first
        cfg, market = resolve(cfg, run_dir, log=print if ctx.is_main else (lambda _msg: None))
        return train_one(cfg, ctx, started_at, market)[0]


def train_one(cfg: ForecastConfig, ctx: DistContext, started_at: float,
              market: LoadedMarket) -> tuple[dict | None, StopReason]:
    """One run (the plain split, or one walk-forward fold) of a settled config (trainers.forecast.data.resolve) on
    its market: (results on rank 0, the agreed stop)."""
    run_dir = Path(cfg.run_dir)
    store, data_info = make_store(cfg, market)
    n_train = len(store.sample_ids["train"])
    refuse_steps_larger_than_the_split(cfg, ctx.world_size, n_train)
    cursor = EpochCursor(n_train, ctx.world_size, ctx.rank, cfg.batch_size * cfg.grad_accum, cfg.seed)
    total_steps = cfg.epochs * cursor.steps_per_epoch
    total_steps = total_steps if cfg.max_steps is None else min(total_steps, cfg.max_steps)

    precision = precision_for(ctx.device, cfg.precision, cfg.gpu_defaults)
    tf32 = enable_tf32(ctx.device)
    compiled = compile_default(cfg.compile, ctx.device, cfg.gpu_defaults)
    torch.manual_seed(cfg.seed)  # identical init on every rank (DDP also broadcasts rank 0's weights)
    model = build_model(cfg, store).to(ctx.device)
    store.to(ctx.device)  # new tensors: a reference taken before this line would index the host copy
    train_ids = store.sample_ids["train"]
    optimizer = build_adamw(model, cfg.lr, cfg.weight_decay, (0.9, 0.95), ctx.device, cfg.gpu_defaults)
    scheduler = build_scheduler(optimizer, lambda: total_steps, cfg.warmup_steps, cfg.min_lr_ratio)  # (as resumed)
    scaler = make_grad_scaler(ctx.device, precision)
    shape = PRESETS[cfg.preset]
    flops = model_flops(cfg, len(store.feature_names))

    states = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
    with Run(cfg, ctx, RunSpec("forecast", states, total_steps, unit="samples", metric_name="loss",
                               eval_every=cfg.eval_every, flops_per_item=flops, started_at=started_at,
                               data_fingerprint=fingerprint_to_check(run_dir, market.fingerprint))) as run:
        log = run.log
        log.info("forecast: %s preset, %s parameters (%s), %d rank(s) on %s, precision %s%s", cfg.preset,
                 f"{count_parameters(model):,}", model_text(cfg), ctx.world_size, ctx.device.type, precision.name,
                 ", TF32" if tf32 else "")
        log.info("data: %s", data_text(data_info, store, cfg.target))
        log.info("schedule: %d steps per epoch, %d steps total, global batch %d", cursor.steps_per_epoch, total_steps,
                 cfg.batch_size * cfg.grad_accum * ctx.world_size)

        at = lambda s: EpochCursor.start(s.position, s.position_rank0)  # noqa: E731
        cap = lambda s: float("inf") if cfg.max_steps is None else cfg.max_steps - s.step  # noqa: E731
        start = run.resume(lambda s: min(steps_left(cursor.steps_per_epoch, cfg.epochs, at(s)), cap(s)))
        cursor = EpochCursor(n_train, ctx.world_size, ctx.rank, cfg.batch_size * cfg.grad_accum, cfg.seed,
                             device=ctx.device, **at(start))
        total_steps = run.total_steps
        if not start.resumed:
            run.evaluated(0, validation_loss(model, store, ctx, cfg.eval_batch_size), initial=True)
        train_step = ddp = TrainStep(model)
        if ctx.distributed:
            train_step = ddp = wrap_ddp(train_step, ctx, accumulates=cfg.grad_accum > 1)  # the target-scale buffers never change
        train_step = maybe_compile(train_step, compiled, log=log)
        micro_size = cfg.batch_size  # every micro-batch padded to this: one shape for the whole run

        step = start.step
        window_sse = torch.zeros((), dtype=torch.float64, device=ctx.device)
        window_count = 0
        scale = torch.ones((), device=ctx.device)  # filled each step: a kernel, not a copy from the host
        model.train()
        while step < total_steps and not start.ended:
            positions, global_count = cursor.batch()  # on the device already: no copy per step
            # Mean over the global batch: DDP averages over ranks, so scale by world/global.
            scale.fill_(ctx.world_size / global_count)
            micro = [part for part in torch.tensor_split(positions, cfg.grad_accum) if len(part)]
            for i, part in enumerate(micro):
                sync_now = i == len(micro) - 1 or not ctx.distributed
                ids, weight = padded(train_ids[part], micro_size)
                with contextlib.nullcontext() if sync_now else ddp.no_sync():
                    window_sse += forward_backward(train_step, store, ids, weight, ctx.device, precision, scaler,
                                                   scale)
            optimizer_step(model, optimizer, scaler, cfg.grad_clip)
            scheduler.step()
            step += 1
            window_count += len(positions)
            end_of_epoch = cursor.advance()

            if run.should_log(step):
                sse, count = all_reduce_sum(ctx, [float(window_sse), float(window_count)])
                run.log_train(step, {"loss": sse / count, "lr": scheduler.get_last_lr()[0], "epoch": cursor.epoch})
                window_sse.zero_()
                window_count = 0
            if run.should_eval(step, end_of_epoch):
                with run.timing("evaluation"):
                    run.evaluated(step, validation_loss(model, store, ctx, cfg.eval_batch_size))
            if run.step_done(step, cursor.position(), global_count, loss=window_sse) != StopReason.NONE:
                break

        summary = {"data": data_info,
                   "model": {"preset": cfg.preset, "parameters": count_parameters(model), "shape": shape.__dict__,
                             "readout": cfg.readout, "linear_skip": cfg.linear_skip, "past_returns": cfg.past_returns,
                             "encoder": cfg.encoder, "flops_per_sample_train": flops},
                   "preprocessing": store.preprocessing(),
                   "training": {"epoch": cursor.epoch, "steps_per_epoch": cursor.steps_per_epoch,
                                "precision": precision.name, "tf32": tf32, **compile_facts(train_step, ctx),
                                "global_batch": cfg.batch_size * cfg.grad_accum * ctx.world_size}}
        return run.finish(summary, evaluate=lambda: final_evaluation(run, model, store, ctx, cfg)), run.reason

