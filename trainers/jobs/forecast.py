"""The S&P 500 return forecaster (seed 000): config, training loop, evaluation.

The loop reads top to bottom: build data and model, resume if a checkpoint exists, train with
stops agreed by all ranks, leave a final checkpoint, evaluate the best checkpoint against the
baselines, write results.json.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers.data.market import to_panel
from trainers.data.sharding import EpochPlan
from trainers.data.sources import DataRequest, check_source, load_source
from trainers.data.universe import resolve_tickers
from trainers.data.windows import FEATURES, WindowStore, build_store
from trainers.errors import UsageError
from trainers.evaluation import forecast_metrics
from trainers.models.forecaster import PRESETS, Forecaster, count_parameters
from trainers.runtime import config as cfgmod
from trainers.runtime.checkpoint import CheckpointManager, atomic_write_json
from trainers.runtime.config import option
from trainers.runtime.dist import DistContext, all_gather_object, all_reduce_sum, barrier, distributed
from trainers.runtime.faults import maybe_inject
from trainers.runfiles import open_run_dir
from trainers.runtime.info import git_commit, peak_memory_bytes, run_facts, versions
from trainers.runtime.logs import get_logger, progress
from trainers.runtime.precision import (PRECISIONS, autocast, build_adamw, enable_tf32, make_grad_scaler,
                                        maybe_compile, precision_for)
from trainers.runtime.schedule import build_scheduler
from trainers.runtime.options import RunOptions
from trainers.runtime.stops import EarlyStopping, StopAgreement, StopReason


@dataclass
class ForecastConfig(RunOptions):
    run_dir: str = option("runs/forecast", "run folder: checkpoints, logs, results (resumed if it holds a run)")
    # data
    source: str = option("synthetic", "market data: synthetic, yfinance (fetch missing into the cache), cache, "
                         "or file:PATH (long-format CSV/parquet)")
    universe: str = option("sp500", "ticker universe for yfinance when no --tickers are given")
    tickers: str | None = option(None, "comma-separated symbols, e.g. AAPL,MSFT,BRK-B")
    tickers_file: str | None = option(None, "file of symbols, one per line (or a CSV with a symbol column)")
    cache_dir: str = option("cache/sp500", "parquet price cache of the yfinance and cache sources", resume_safe=True)
    years: float = option(25.0, "history to use when --start is not given")
    start: str | None = option(None, "first date (YYYY-MM-DD); fixed in config.json on the first run")
    end: str | None = option(None, "end date, exclusive (default: today); fixed in config.json on the first run")
    min_history_days: int = option(252, "tickers with fewer valid bars are excluded")
    synthetic_tickers: int = option(48, "tickers in the synthetic market")
    synthetic_days: int = option(2520, "trading days in the synthetic market")
    data_seed: int = option(0, "seed of the synthetic market")
    synthetic_momentum: float = option(0.03, "strength of the synthetic market's momentum effect (0: none)")
    window: int = option(120, "input window in trading days")
    horizon: int = option(20, "forecast horizon in trading days (target: log return over it)")
    val_frac: float = option(0.15, "share of usable dates for validation")
    test_frac: float = option(0.15, "share of usable dates for test")
    min_split_dates: int = option(20, "fewest anchor dates each split may have")
    # model
    preset: str = option("tiny", "model size", choices=tuple(PRESETS))
    dropout: float = option(0.1, "dropout on the residual branches")
    # optimisation
    epochs: int = option(2, "passes over the training split")
    max_steps: int | None = option(None, "stop after this many optimizer steps")
    batch_size: int = option(256, "samples per rank per micro-batch")
    grad_accum: int = option(1, "micro-batches per optimizer step")
    lr: float = option(1e-3, "peak learning rate")
    min_lr_ratio: float = option(0.1, "final LR as a share of the peak (cosine floor)")
    warmup_steps: int = option(50, "linear warmup steps")
    weight_decay: float = option(0.1, "AdamW weight decay on matrices")
    grad_clip: float = option(1.0, "clip the global gradient norm to this (0: off)")
    seed: int = option(0, "seed of model init and shuffling (each rank offsets it by its rank)")
    # runtime
    precision: str = option("auto", "auto: bf16 on Ampere+, fp16 + grad scaler on older GPUs, fp32 on CPU",
                            choices=PRECISIONS)
    compile: bool = option(False, "torch.compile the model", resume_safe=True)
    # stops, checkpoints, logging
    min_delta: float = option(0.0, "improvement smaller than this does not count", resume_safe=True)
    eval_every: int = option(0, "evaluate validation loss every N steps (0: at each epoch end)", resume_safe=True)
    eval_batch_size: int = option(1024, "samples per rank per evaluation batch", resume_safe=True)

    def validate(self) -> None:
        """Cheap checks that need no data; run before anything touches the disk."""
        self.validate_run_options()
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision {self.precision!r} is not one of: {', '.join(PRECISIONS)}")
        check_source(self.source)
        if self.years <= 0:
            raise UsageError(f"--years {self.years} must be > 0")
        if self.preset not in PRESETS:
            raise UsageError(f"--preset {self.preset!r} is not one of: {', '.join(PRESETS)}")
        if self.horizon <= 0:
            raise UsageError(f"--horizon {self.horizon} must be > 0 trading days")
        if self.window < 2:
            raise UsageError(f"--window {self.window} must be >= 2 trading days")
        for name in ("epochs", "batch_size", "grad_accum", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise UsageError(f"--max-steps {self.max_steps} must be >= 1")
        if not (0 < self.val_frac < 1 and 0 < self.test_frac < 1 and self.val_frac + self.test_frac < 1):
            raise UsageError(f"--val-frac {self.val_frac} and --test-frac {self.test_frac} must be in (0, 1) "
                             f"and sum to less than 1")
        if self.lr <= 0:
            raise UsageError(f"--lr {self.lr} must be > 0")
        if self.warmup_steps < 0 or self.grad_clip < 0:
            raise UsageError("--warmup-steps and --grad-clip must be >= 0")
        if not 0 <= self.dropout < 1:
            raise UsageError(f"--dropout {self.dropout} must be in [0, 1)")


# ---- shared pieces (also used by evaluate/export) ----------------------------------------------

def data_request(cfg: ForecastConfig) -> DataRequest:
    tickers = None
    if cfg.source == "yfinance" or cfg.tickers or cfg.tickers_file:
        # file and cache sources use every ticker they hold unless told otherwise
        tickers = resolve_tickers(cfg.tickers, cfg.tickers_file, cfg.universe)
    return DataRequest(source=cfg.source, tickers=tickers, cache_dir=cfg.cache_dir, start=cfg.start, end=cfg.end,
                       years=cfg.years, min_rows=cfg.min_history_days, synthetic_tickers=cfg.synthetic_tickers,
                       synthetic_days=cfg.synthetic_days, synthetic_seed=cfg.data_seed,
                       synthetic_momentum=cfg.synthetic_momentum)


def fix_date_range(cfg: ForecastConfig, saved: dict | None) -> None:
    """Real data: pin start/end on the first run so a resume next week reads the same dates."""
    if cfg.source == "synthetic":
        return
    if saved is not None:
        cfg.start = cfg.start or saved.get("start")
        cfg.end = cfg.end or saved.get("end")
    else:
        cfg.start, cfg.end = data_request(cfg).date_range()


def load_store(cfg: ForecastConfig, log=print) -> tuple[WindowStore, dict]:
    frame, source_info = load_source(data_request(cfg), log=log)
    store = build_store(to_panel(frame), cfg.window, cfg.horizon, cfg.val_frac, cfg.test_frac, cfg.min_split_dates)
    plan = store.plan
    data_info = {
        **source_info, "tickers": store.tickers, "n_tickers": store.n_tickers,
        "first_date": store.dates[0], "last_date": store.dates[-1], "n_dates": len(store.dates),
        "embargo_dates": plan.embargo, "samples": store.stats,
        "anchor_dates": {s: [store.dates[a], store.dates[b - 1]] for s, (a, b) in plan.ranges.items()},
        "features": list(FEATURES),
    }
    return store, data_info


def build_model(cfg: ForecastConfig, store: WindowStore | None = None) -> Forecaster:
    model = Forecaster(PRESETS[cfg.preset], n_features=len(FEATURES), window=cfg.window, dropout=cfg.dropout)
    if store is not None:
        model.target_mean.fill_(store.target_mean)
        model.target_std.fill_(store.target_std)
    return model


@torch.no_grad()
def predict_split(model: Forecaster, store: WindowStore, split: str, ctx: DistContext, batch_size: int,
                  precision) -> tuple[np.ndarray, np.ndarray] | None:
    """Predicted log returns for every sample of `split`, sharded over ranks, gathered on rank 0."""
    model.eval()
    ids = store.sample_ids[split][ctx.rank::ctx.world_size]
    preds = []
    for start in range(0, len(ids), batch_size):
        x, _ = store.gather(ids[start:start + batch_size])
        with autocast(ctx.device, precision):
            preds.append(model.predict_return(x).float())
    local = (ids.cpu().numpy(), torch.cat(preds).cpu().numpy() if preds else np.zeros(0, np.float32))
    parts = all_gather_object(ctx, local)
    if not ctx.is_main:
        return None
    all_ids = np.concatenate([p[0] for p in parts])
    all_pred = np.concatenate([p[1] for p in parts])
    order = np.argsort(all_ids)
    return all_ids[order], all_pred[order]


def evaluate_splits(model: Forecaster, store: WindowStore, ctx: DistContext, batch_size: int, precision,
                    splits=("val", "test")) -> dict | None:
    out = {}
    for split in splits:
        got = predict_split(model, store, split, ctx, batch_size, precision)
        if got is None:
            continue
        ids, pred = got
        ids_t = torch.from_numpy(ids).to(store.target.device)
        t = store.date_index(ids_t)
        n = ids_t - t * store.n_tickers
        out[split] = forecast_metrics(t.cpu().numpy(), pred.astype(np.float64),
                                      store.target[t, n].double().cpu().numpy(),
                                      store.past_return[t, n].double().cpu().numpy(), store.target_mean)
    return out if ctx.is_main else None


@torch.no_grad()
def validation_loss(model: torch.nn.Module, store: WindowStore, ctx: DistContext, batch_size: int, precision) -> float:
    """Mean squared error in standardised units over the whole validation split (all ranks agree)."""
    model.eval()
    ids = store.sample_ids["val"][ctx.rank::ctx.world_size]
    sse = 0.0
    for start in range(0, len(ids), batch_size):
        x, y = store.gather(ids[start:start + batch_size])
        with autocast(ctx.device, precision):
            pred = model(x).float()
        sse += float(((pred - (y - store.target_mean) / store.target_std) ** 2).sum())
    total_sse, count = all_reduce_sum(ctx, [sse, float(len(ids))])
    model.train()
    return total_sse / count


def _rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def forward_backward(train_model: torch.nn.Module, store: WindowStore, ids: torch.Tensor, device: torch.device,
                     precision, scaler, loss_scale: float) -> torch.Tensor:
    """One micro-batch: gather windows by index, forward under autocast, backward of the scaled
    sum of squared errors (standardised target). Returns the unscaled SSE, detached."""
    x, y = store.gather(ids)
    y = (y - store.target_mean) / store.target_std
    with autocast(device, precision):
        pred = train_model(x)
    sse = ((pred.float() - y) ** 2).sum()
    scaler.scale(sse * loss_scale).backward()
    return sse.detach()


def optimizer_step(model: torch.nn.Module, optimizer, scaler, grad_clip: float) -> None:
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def write_results(run_dir: Path, update: dict) -> dict:
    """Merge `update` into results.json atomically (other commands add their sections)."""
    path = run_dir / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results.update(update)
    atomic_write_json(path, results)
    return results


# ---- training -----------------------------------------------------------------------------------

def train(cfg: ForecastConfig) -> dict | None:
    cfg.validate()
    with distributed(cfg.device, cfg.collective_timeout_s) as ctx:
        return _train(cfg, ctx)


def _train(cfg: ForecastConfig, ctx: DistContext) -> dict | None:
    wall_start = time.time()
    run_dir = Path(cfg.run_dir)
    # Everything that can reject the input happens before the first write into run_dir.
    saved = cfgmod.saved_config(run_dir)
    fix_date_range(cfg, saved)
    cfgmod.check_run_dir_compatible(run_dir, cfg)
    store, data_info = load_store(cfg, log=print if ctx.is_main else (lambda _msg: None))
    precision = precision_for(ctx.device, cfg.precision)
    n_train = len(store.sample_ids["train"])
    steps_per_epoch = EpochPlan(n_train, ctx.world_size, ctx.rank, cfg.batch_size * cfg.grad_accum,
                                cfg.seed, 0).steps
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)

    log, metrics = open_run_dir(run_dir, cfg, ctx)
    try:
        return _train_loop(cfg, ctx, run_dir, store, data_info, precision, steps_per_epoch, total_steps,
                           log, metrics, wall_start)
    finally:
        metrics.close()


def _train_loop(cfg, ctx, run_dir, store, data_info, precision, steps_per_epoch, total_steps, log, metrics,
                wall_start):
    tf32 = enable_tf32(ctx.device)
    torch.manual_seed(cfg.seed)  # identical init on every rank (DDP also broadcasts rank 0's weights)
    model = build_model(cfg, store).to(ctx.device)
    n_params = count_parameters(model)
    store.to(ctx.device)
    log.info("forecast: %s preset, %s parameters, %d rank(s) on %s, precision %s%s", cfg.preset,
             f"{n_params:,}", ctx.world_size, ctx.device.type, precision.name, ", TF32" if tf32 else "")
    log.info("data: %s; %d tickers x %d dates; samples train/val/test %s; embargo %d dates",
             data_info["source"], data_info["n_tickers"], data_info["n_dates"],
             "/".join(str(store.stats[s]) for s in ("train", "val", "test")), store.plan.embargo)
    log.info("schedule: %d steps per epoch, %d steps total, global batch %d", steps_per_epoch, total_steps,
             cfg.batch_size * cfg.grad_accum * ctx.world_size)

    optimizer = build_adamw(model, cfg.lr, cfg.weight_decay, (0.9, 0.95), ctx.device)
    scheduler = build_scheduler(optimizer, total_steps, cfg.warmup_steps, cfg.min_lr_ratio)
    scaler = make_grad_scaler(ctx.device, precision)
    ckpt = CheckpointManager(run_dir / "checkpoints", ctx, cfg.keep_last, log)
    early = EarlyStopping(cfg.patience, cfg.min_delta)

    step, epoch, start_in_epoch, elapsed_before = 0, 0, 0, 0.0
    resumed = ckpt.resume(ctx.device)
    if resumed is not None:
        shared = resumed.shared
        model.load_state_dict(shared["model"])
        optimizer.load_state_dict(shared["optimizer"])
        scheduler.load_state_dict(shared["scheduler"])
        scaler.load_state_dict(shared["scaler"])
        step, elapsed_before = shared["step"], shared["elapsed_s"]
        early = EarlyStopping(cfg.patience, cfg.min_delta, **shared["early_stopping"])
        if resumed.rank_state is not None:
            epoch, start_in_epoch = resumed.rank_state["epoch"], resumed.rank_state["step_in_epoch"]
            _set_rng_state(resumed.rank_state["rng"], ctx.device)
        else:
            epoch, start_in_epoch = shared["epoch"], 0
        log.info("resumed from checkpoint step %d (epoch %d, step %d in epoch)", step, epoch, start_in_epoch)
    else:
        torch.manual_seed(cfg.seed + 1_000 * (ctx.rank + 1))  # per-rank dropout streams

    train_model = maybe_compile(model, cfg.compile)
    if ctx.distributed:
        train_model = DDP(train_model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    stopper = StopAgreement(ctx, cfg.budget(ctx.world_size), elapsed_before)
    stopper.install_signal_handlers()

    def save(current_epoch: int, step_in_epoch: int, plan: EpochPlan | None, metric: float | None) -> None:
        shared = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "step": step,
                  "epoch": current_epoch, "elapsed_s": stopper.elapsed_s(), "early_stopping": early.state_dict(),
                  "initial_val_loss": initial_val}
        rank_state = {"epoch": current_epoch, "step_in_epoch": step_in_epoch, "rng": _rng_state(ctx.device),
                      "consumed": plan.consumed_before(step_in_epoch) if plan else 0}
        ckpt.save(step, shared, rank_state, {"metric": metric, "epoch": current_epoch, "config": cfgmod.to_dict(cfg)})
        last_saved[0] = step

    last_saved = [resumed.step if resumed else -1]
    if resumed is None:
        # The untrained model's validation loss: the point "the loss falls" is measured from.
        initial_val = validation_loss(model, store, ctx, cfg.eval_batch_size, precision)
        metrics.log(0, "val", {"loss": initial_val, "initial": True})
        log.info("step 0: val loss %.5f (untrained)", initial_val)
    else:
        initial_val = resumed.shared.get("initial_val_loss")
    train_ids = store.sample_ids["train"]
    bar = progress(total_steps, step, ctx.is_main, "train")
    reason = StopReason.NONE
    train_time = 0.0
    samples_seen = 0
    first_loss = last_loss = None
    last_val = early.best
    window_sse, window_count = 0.0, 0
    model.train()
    try:
        while reason == StopReason.NONE and step < total_steps:
            plan = EpochPlan(len(train_ids), ctx.world_size, ctx.rank, cfg.batch_size * cfg.grad_accum, cfg.seed, epoch)
            for s in range(start_in_epoch, plan.steps):
                t0 = time.perf_counter()
                positions = plan.batch(s).to(ctx.device)
                global_count = plan.global_count(s)
                micro = torch.tensor_split(positions, cfg.grad_accum)
                step_sse = 0.0
                for i, part in enumerate(micro):
                    if len(part) == 0:
                        continue
                    sync_now = i == len(micro) - 1 or not ctx.distributed
                    with (contextlib.nullcontext() if sync_now else train_model.no_sync()):
                        # Mean over the global batch: DDP averages over ranks, so scale by world/global.
                        sse = forward_backward(train_model, store, train_ids[part], ctx.device, precision, scaler,
                                               ctx.world_size / global_count)
                    step_sse += float(sse)
                optimizer_step(model, optimizer, scaler, cfg.grad_clip)
                scheduler.step()
                step += 1
                dt = time.perf_counter() - t0
                train_time += dt
                samples_seen += global_count
                window_sse += step_sse
                window_count += len(positions)
                bar.update(1)
                maybe_inject(ctx.rank, step, ctx.restart_count)

                if step % cfg.log_every == 0 or step == total_steps:
                    g_sse, g_count = all_reduce_sum(ctx, [window_sse, float(window_count)])
                    last_loss = g_sse / g_count
                    first_loss = last_loss if first_loss is None else first_loss
                    metrics.log(step, "train", {"loss": last_loss, "lr": scheduler.get_last_lr()[0],
                                                "samples_per_s": global_count / dt, "step_time_s": dt,
                                                "epoch": epoch, "peak_memory_bytes": peak_memory_bytes(ctx.device)})
                    bar.set_postfix(loss=f"{last_loss:.4f}")
                    window_sse, window_count = 0.0, 0

                end_of_epoch = s == plan.steps - 1
                evaluate_now = end_of_epoch if cfg.eval_every == 0 else step % cfg.eval_every == 0
                if evaluate_now or step == total_steps:
                    last_val = validation_loss(model, store, ctx, cfg.eval_batch_size, precision)
                    improved = early.update(last_val)
                    metrics.log(step, "val", {"loss": last_val, "best": early.best, "improved": improved})
                    log.info("step %d epoch %d: val loss %.5f%s", step, epoch, last_val,
                             " (best)" if improved else f" ({early.bad_evals} without improvement)")
                    if early.should_stop:
                        stopper.request(StopReason.EARLY_STOP)
                    save(epoch + (1 if end_of_epoch else 0), 0 if end_of_epoch else s + 1, plan, last_val)
                elif step % cfg.ckpt_every == 0:
                    save(epoch, s + 1, plan, None)

                reason = stopper.agree()
                if reason == StopReason.NONE and step >= total_steps:
                    reason = StopReason.COMPLETED
                if reason != StopReason.NONE:
                    if last_saved[0] != step:
                        save(epoch + (1 if end_of_epoch else 0), 0 if end_of_epoch else s + 1, plan, None)
                    break
            else:
                epoch += 1
                start_in_epoch = 0
                continue
            break
        if reason == StopReason.NONE:  # resumed at or past the last step
            reason = StopReason.COMPLETED
    finally:
        bar.close()
        stopper.restore_signal_handlers()

    log.info("training stopped: %s at step %d%s", reason.name.lower(), step,
             f" ({stopper.signal_name})" if stopper.signal_name else "")
    elapsed = stopper.elapsed_s()
    sps = samples_seen / train_time if train_time > 0 else None
    training = {
        "stop_reason": reason.name.lower(), "signal": stopper.signal_name, "steps": step, "total_steps": total_steps,
        "steps_per_epoch": steps_per_epoch, "epoch": epoch, "first_logged_train_loss": first_loss,
        "last_logged_train_loss": last_loss, "initial_val_loss": initial_val, "last_val_loss": last_val, "best_val_loss": early.best,
        "samples_per_s_global": sps, "samples_per_s_per_device": sps / ctx.world_size if sps else None,
        "train_step_time_s": train_time, "wall_time_s_this_attempt": time.time() - wall_start,
        **run_facts(ctx, elapsed, cfg.budget(ctx.world_size).cost_usd(elapsed)),
        "precision": precision.name, "tf32": tf32, "compiled": cfg.compile,
        "global_batch": cfg.batch_size * cfg.grad_accum * ctx.world_size,
    }
    results = {"trainer": "forecast", "config": cfgmod.to_dict(cfg), "data": data_info,
               "model": {"preset": cfg.preset, "parameters": n_params, "shape": PRESETS[cfg.preset].__dict__},
               "training": training, "preprocessing": store.preprocessing(), "git_commit": git_commit(),
               "versions": versions()}
    if reason == StopReason.SIGNAL:
        # torchrun sends SIGKILL 30 s after SIGTERM: the checkpoint is safe, evaluation would not be.
        results["evaluation"] = {"skipped": f"stopped by {stopper.signal_name}; run `trainers evaluate "
                                            f"--run-dir {run_dir}` for the metrics"}
    else:
        results["evaluation"] = evaluate_checkpoint(cfg, ctx, model, store, ckpt, precision, log)
    if ctx.is_main:
        write_results(run_dir, results)
        log.info("results: %s", run_dir / "results.json")
    barrier(ctx)
    return results if ctx.is_main else None


def evaluate_checkpoint(cfg, ctx, model, store, ckpt: CheckpointManager, precision, log, which: str = "best"):
    """Load the best (or latest) checkpoint's weights into `model` and evaluate val and test."""
    steps = ckpt.complete_steps()
    step = ckpt.best_step() if which == "best" else None
    if step is None and steps:
        step = steps[0] if which in ("best", "latest") else None
    if which not in ("best", "latest"):
        step = int(which)
        if step not in steps:
            raise UsageError(f"--checkpoint {which}: no complete checkpoint at that step; have {steps}")
    if step is not None:
        model.load_state_dict(ckpt.load_verified(step, ctx.device)["model"])
    evaluation = evaluate_splits(model, store, ctx, cfg.eval_batch_size, precision)
    if ctx.is_main:
        evaluation["checkpoint_step"] = step
        for split in ("val", "test"):
            e = evaluation[split]
            log.info("%s: model acc %.4f mse %.3e IC %s | always-up %.4f persistence %.4f zero-mse %.3e",
                     split, e["model"]["directional_accuracy"], e["model"]["mse"],
                     "n/a" if e["model"]["ic_mean"] is None else f"{e['model']['ic_mean']:.4f}",
                     e["baselines"]["always_up"]["directional_accuracy"],
                     e["baselines"]["persistence"]["directional_accuracy"], e["baselines"]["zero_return"]["mse"])
    return evaluation


def evaluate_run(run_dir: str, checkpoint: str = "best", device: str = "auto") -> dict | None:
    """`trainers evaluate`: re-evaluate a run's checkpoint (single process or under torchrun)."""
    from trainers.runfiles import load_run_config, resolve_checkpoint

    cfg = load_run_config(Path(run_dir), ForecastConfig)
    with distributed(device, cfg.collective_timeout_s) as ctx:
        log = get_logger(ctx.rank, None)
        store, _ = load_store(cfg)
        store.to(ctx.device)
        precision = precision_for(ctx.device, cfg.precision if ctx.device.type == "cuda" else "auto")
        ckpt = CheckpointManager(Path(run_dir) / "checkpoints", ctx, cfg.keep_last, log)
        step = resolve_checkpoint(ckpt, checkpoint)
        model = build_model(cfg).to(ctx.device)
        evaluation = evaluate_checkpoint(cfg, ctx, model, store, ckpt, precision, log, which=str(step))
        if ctx.is_main:
            write_results(Path(run_dir), {"evaluation": evaluation})
        barrier(ctx)
        return evaluation
