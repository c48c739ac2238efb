"""The per-symbol LSTMs for the planner: many small independent models, `--jobs-per-gpu` of them on
each GPU at once. Counted on the real model (it is small) on the CPU: parameters, FLOPs per sample,
and the bytes autograd saves per sample (trainers.ops.plan.saved_bytes_per_item)."""

from __future__ import annotations

import itertools
import math
import sys

import numpy as np

from trainers.errors import UsageError
from trainers.lstm.config import LstmConfig, Timeframe, n_features
from trainers.lstm.export_behind import exports_behind
from trainers.ops.plan import PLAN_GPU_MEMORY, Workload, forward_flops, saved_bytes_per_item

SMALL_STEP_S = 0.003  # an eager step of a small model on a GPU: launches and Python, not FLOPs (assumed)
# A symbol's own run outside its steps (folder and lock, evaluations and checkpoints, the final evaluation
# and baselines, results): on the H100 (bench/results/gpu_h100/lstm_cohort_h100.json, 21fae23) 500 symbols
# one at a time took 127.4 s of job time, 0.255 s a symbol, of which its 30 steps at SMALL_STEP_S are 0.09 s.
SYMBOL_RUN_S = 0.165
# In cohorts (--cohort, a GPU's default), from the H200's two cohort jobs of the default model, 5 epochs
# (bench/results/gpu_h200/cohort_packing_gpu.runs.json, aadb2aa; each job's time outside its steps is
# sum_symbol_s x share_outside_steps, its steps' the rest): 64 symbols in one cohort spent 10.31 s outside their
# steps, 500 in two (256 + 244) 47.38 s. A cohort's own part (its set-up, its first steps' warm-up, its end) and a
# member's solve 10.31 = c + 64 s and 47.38 = 2 c + 500 s: a fit of two runs, not an independent check. The
# jobs time their steps on the host, which does not wait for the device: the split between the steps and the
# rest is the jobs' records (the steps' device work the host waited for later counts outside), the sum is right.
# Measured with each new best written (--ckpt-at-eval improved): a held job takes held_saves_s a symbol off.
COHORT_RUN_S = 5.70
COHORT_SYMBOL_RUN_S = 0.072
# A new best held in host memory until the symbol's next checkpoint (--ckpt-at-eval held, the default since
# 0f6f438; a symbol's run never has a budget of its own, so every symbol holds): the 500-symbol job of the default
# model on the H200, 5 epochs (an evaluation at each epoch's end), run both ways one command apart
# (bench/results/gpu_h200/lstm_ckpt_at_eval_gpu.json: 2,095 checkpoints written against 774), spent 26.64 s
# of its members' time in step_done writing each new best and 17.25 s holding them, the same final evaluations. A
# symbol's last evaluation is written either way: the saving is counted for each evaluation before it (none at one
# epoch), and none where the step cadence (--ckpt-every) comes at least as often as the evaluations, since a best
# on a cadence step is written at once. Measured in cohorts against improved, on one run (the same session's other
# held job of this command ran 3.8 s faster: the noise is about half the effect); one at a time (--cohort 1) takes
# the same off SYMBOL_RUN_S, which was measured writing every evaluation's checkpoint (always, the default then).
MEASURED_EVALUATIONS = 5  # the measured job's: 5 epochs, one evaluation each
HELD_SAVES_PER_EVAL_S = (26.636 - 17.247) / 500 / (MEASURED_EVALUATIONS - 1)
# The stacked step: the 500-symbol job's stacked steps (2 cohorts x 30) took 10.12 s for 500 symbols of 5 epochs,
# 2.9 us a sample as the plan counts samples (1,391 a symbol and epoch at the synthetic default: the job's own split
# of 2,520 bars, train_samples; the job trained 6 batches of 256 an epoch) of the default model (hidden 64, 2 layers,
# window 64); scaled by FLOPs for another shape, an assumption. Smaller cohorts use the card less well: the
# 64-symbol job's steps took 2.33 s, this says 1.3. (Fitted to 1,764 a symbol and epoch, 2.3 us, while the plan
# counted days x (1 - val - test).)
STACKED_SAMPLE_S = 10.117 / (500 * 5 * 1391)
# The ONNX export of each finished symbol (--export, the default; the constants above are --no-export jobs'), on the
# worker's host CPU. A worker's first symbol is a torch.onnx.export (with torch.onnx's warm-up) and the CPU latency
# measurement, its second one more export that works out how the graph is reused; every symbol after gets the graph
# with its own weights and onnxruntime's parity check. The worker's part from the development VM
# (bench/results/lstm_export_default_cpu.json: 32 symbols of the default model, one worker of one thread, 14.76 s
# longer with the exports on, 0.043 s of it a reused symbol's median). A symbol's from the H200 host
# (bench/results/gpu_h200/, eab6a5d: the 500-symbol job of the default model, 5 epochs, one worker, run
# twice by the same command, torch on every core: 97.72 s with the exports on, 63.89 s with --no-export), the
# worker's part taken off: 0.041 s a symbol, the dev VM's speed. The session before (1adc135) had measured 0.18 s,
# its parity check's onnxruntime on its default pool (every core, spinning) beside torch's 16 threads: 8.4x slower
# a check on that host (bench/results/gpu_h200/onnx_parity_threads_gpu.json), and one thread since. Thin: one run's difference of two
# job times, of the default model whatever the shape, a worker's part charged once whatever its symbols (and once
# per architecture: a job of mixed feature counts pays it per group).
EXPORT_WORKER_S = 14.76 - 32 * 0.043
EXPORT_SYMBOL_S = (97.72 - 63.89 - EXPORT_WORKER_S) / 500
# Exported behind the training (--export-behind, a GPU deploy's default: each worker's own exporter process, one
# thread). A cohort's symbols finish together and go to the exporter then; it pays its first exports once
# (EXPORT_WORKER_S) and then takes a symbol after another, while the worker trains its next cohort: the job waits
# for what is left when its training ends (exports_after_training_s). The exporter's time a symbol is fitted to
# the 500-symbol job on one H200 three ways, one command apart (bench/results/gpu_h200/
# lstm_export_behind_gpu.json): the training alone (--no-export) 54.49 s, its two cohorts (256, 244) ending at
# their share of it, and 24.08 s more with the exports behind. The exporter was behind from its first cohort on:
# 0.075 s a symbol, slower than in the worker (torch on one thread beside the training, where the worker's export
# ran on all of them). One run's fit; a worker with a single cohort (8 GPUs for those 500 symbols) waits for all
# of its exports.
EXPORT_BEHIND_SYMBOL_S = (54.494 + 24.080 - 54.494 * 256 / 500 - EXPORT_WORKER_S) / 500


def workload(cfg: LstmConfig, memory_bytes: int = PLAN_GPU_MEMORY, workers: int = 1,
             counted: dict | None = None) -> Workload:
    """The job of these options on `workers` workers of GPUs of `memory_bytes` (one 80 GB card until the plan
    names its GPU: Workload.for_device forms the cohorts again for it and its workers, as the job would)."""
    import torch

    from trainers.lstm.build import build_model

    if counted is None:  # the model's own numbers, whatever the device: counted once
        model = build_model(cfg).train()
        n_in = model.lstm.input_size
        default = build_model(LstmConfig()).train()
        counted = {"n_in": n_in, "parameters": sum(p.numel() for p in model.parameters()),
                   "per_sample": saved_bytes_per_item(model, lambda b: (torch.randn(b, cfg.window, n_in),)),
                   "stacked_per_sample": stacked_saved_bytes_per_sample(cfg, n_in),
                   "flops": 3 * forward_flops(model, (torch.randn(1, cfg.window, n_in),)),
                   "default_flops": 3 * forward_flops(default, (torch.randn(1, LstmConfig().window, n_in),))}
    c = counted
    if "symbols" not in c:  # (counted once: it may read a file)
        c["symbols"], c["per_epoch"] = trained_symbols(cfg)
    symbols = c["symbols"]
    per_epoch = c["per_epoch"]  # a symbol's training samples an epoch (their mean)
    samples = round(per_epoch * symbols * cfg.epochs)
    k = max(1, cfg.jobs_per_gpu or 1)
    per_worker = math.ceil(symbols / max(1, workers))  # a worker claims its share of the symbols (scheduler.claim_cohort)
    members = planned_cohort(cfg, c["stacked_per_sample"], per_worker, memory_bytes)
    held_each = held_saves_s(cfg, math.ceil(per_epoch / cfg.batch_size))
    held = (f"; {held_each:.3f} s a symbol less for its new bests held until its next checkpoint (--ckpt-at-eval "
            f"held, measured in cohorts on an H200)" if held_each else "")
    # A stacked step trains every member's batch at once, at the measured rate (scaled by FLOPs for another shape);
    # one symbol at a time a step is the launch floor
    per_step = cfg.batch_size * members
    measured = per_step * STACKED_SAMPLE_S * c["flops"] / c["default_flops"]
    step_s = SMALL_STEP_S if members == 1 else max(SMALL_STEP_S, measured)
    # one worker's cohorts, claimed as the job claims them: full ones, then the rest
    cohorts_of = [members] * (per_worker // members) + ([per_worker % members] if per_worker % members else [])
    steps_each = math.ceil(per_epoch / cfg.batch_size) * cfg.epochs  # a cohort's steps, as a symbol's
    export_s, exported = export_cost(cfg, symbols, workers, cohorts_of,
                                     cohort_seconds(cohorts_of, steps_each, step_s, held_each))
    held_s = symbols * held_each
    shape = {"hidden": cfg.hidden, "layers": cfg.layers, "window": cfg.window, "symbols": symbols, "cohort": members}
    for_device = lambda memory, n, _items=None: workload(cfg, memory, n, c)  # noqa: E731
    if members == 1:
        return Workload(
            trainer="lstm", parameters=c["parameters"], n_blocks=1, block_parameters=c["parameters"],
            unit="samples", items_per_micro=cfg.batch_size, grad_accum=1, flops_per_item=c["flops"],
            activation_bytes=lambda micro, _ck: int(c["per_sample"] * micro), kind="small", strategies=("ddp",),
            items_total=float(samples), jobs_per_gpu=k, independent=True, min_step_s=SMALL_STEP_S,
            outside_steps_s=symbols * SYMBOL_RUN_S - held_s + export_s, shape=shape, for_device=for_device,
            notes=[f"{symbols} independent models, {k} at a time per GPU (no gradient traffic between them); about "
                   f"{samples:,} samples in all (window {cfg.window}, {cfg.epochs} epochs); {SYMBOL_RUN_S} s a "
                   f"symbol outside its steps (measured one symbol at a time on an H100){held}{exported}"])
    # A worker fills a cohort before the next, so the largest cohort is `members` (its activations are what must
    # fit); the job's step time is its samples at the measured rate, however the cohorts split them.
    cohorts = len(cohorts_of)  # each worker's
    why = ("ASSUMED: small models are bound by kernel launches and Python, not FLOPs" if measured < SMALL_STEP_S else
           "a stacked step's time per sample, measured in cohorts of the default model on an H200"
           + (", scaled by FLOPs (assumed)" if c["flops"] != c["default_flops"] else ""))
    return Workload(
        trainer="lstm", parameters=c["parameters"], n_blocks=1, block_parameters=c["parameters"], unit="samples",
        items_per_micro=per_step, grad_accum=1, flops_per_item=c["flops"],
        activation_bytes=lambda micro, _ck: int(c["stacked_per_sample"] * micro), kind="small",
        strategies=("ddp",), items_total=float(samples), jobs_per_gpu=k, independent=True,
        min_step_s=step_s, min_step_why=why, for_device=for_device,
        outside_steps_s=max(1, workers) * cohorts * COHORT_RUN_S + symbols * COHORT_SYMBOL_RUN_S - held_s + export_s,
        shape=shape,
        notes=[f"{symbols} independent models in cohorts of up to {members} (--cohort), {cohorts} a worker "
               f"({max(1, workers)} worker(s), {k} per GPU), each cohort one stacked model a step; about "
               f"{samples:,} samples in all (window {cfg.window}, {cfg.epochs} epochs); outside the steps "
               f"{COHORT_RUN_S} s a cohort and {COHORT_SYMBOL_RUN_S} s a symbol (fitted to the H200's two cohort jobs)"
               f"{held}{exported}"])


def trained_symbols(cfg: LstmConfig) -> tuple[int, float]:
    """(the symbols the job trains, their training windows an epoch on average): each symbol's bars as the job will
    have them (job_shape), split as the job splits them. A symbol with too few bars for a training window is left
    out where the job leaves it out (a point-in-time member it was not named), else refused as the job refuses it;
    counted at the mean bars, sp500-pit's short members once made the plan say 0 samples of a job that trains."""
    from trainers.lstm.bars import named_symbols

    bars, base = job_shape(cfg)
    windows = {n: train_samples(cfg, n, base) for n in set(bars)}
    kept = [windows[n] for n in bars if windows[n] > 0]
    if not kept or (len(kept) < len(bars) and (cfg.universe != "sp500-pit" or named_symbols(cfg))):
        raise UsageError(f"{len(bars) - len(kept)} of the job's {len(bars)} symbol(s) have too few bars to train on "
                         f"(the shortest {min(bars):,}; a --window of {cfg.window}, the history its features read, the "
                         f"splits and their embargoes): the job would refuse them; give more history or a shorter "
                         f"--window")
    return len(kept), sum(kept) / len(kept)


def job_shape(cfg: LstmConfig) -> tuple[list[int], Timeframe]:
    """(each symbol's bars, the base bars' interval) as the job finds them (trainers.lstm.bars): those named
    (--symbols, --tickers-file), the synthetic count, the universe's members for yfinance (503 for sp500), else
    every symbol of the file or the cache. Daily bars: the trading days between --start and --end (else --years back
    from today); sp500-pit cuts each symbol to its membership (member_bars). A file or the cache: what it holds as
    the job loads it (validated, within the dates, at its own interval). The plan once counted the seed's three
    symbols for all but --symbols and synthetic (a 500-symbol yfinance job priced as three), calendar days for every
    source (a 6,000-bar hourly file as 2,520 days), ten years whatever --start/--end said, a file's raw rows (symbols
    the job leaves out for bad bars), and every sp500-pit member's whole history."""
    from trainers.lstm.bars import requested_symbols
    from trainers.market.sources import DataRequest, trading_days

    daily = Timeframe(1, "d")
    if cfg.source == "synthetic" and cfg.symbols is None and cfg.tickers_file is None:
        return [cfg.synthetic_days] * cfg.synthetic_tickers, daily
    wanted = requested_symbols(cfg)
    if cfg.source.startswith("file:") or cfg.source == "cache":  # read as the job reads it: validated, dated
        from trainers.lstm.bars import load_bars
        from trainers.lstm.config import resolve_timeframes
        from trainers.lstm.job import pin_dates, point_in_time

        warn = lambda line: print(line, file=sys.stderr)  # noqa: E731
        cfg = pin_dates(cfg, None)  # (the cache's --years back from today, as a first run pins them)
        bars, _ = load_bars(cfg, log=warn)
        base = next(iter(bars.values())).base
        if cfg.universe == "sp500-pit":  # each symbol cut to its membership, as the job cuts it
            bars, _ = point_in_time(bars, cfg, resolve_timeframes(cfg.timeframes, base), log=warn)
        return [len(b.ts) for b in bars.values()], base
    if cfg.source == "synthetic":
        return [cfg.synthetic_days] * len(wanted), daily
    start, end = DataRequest(start=cfg.start, end=cfg.end, years=cfg.years).date_range()
    if cfg.universe == "sp500-pit":
        return member_bars(cfg, wanted, start, end), daily
    return [trading_days(start, end)] * len(wanted), daily  # (yfinance: the universe's members when none are named)


def member_bars(cfg: LstmConfig, symbols: list[str], start: str, end: str) -> list[int]:
    """--universe sp500-pit on daily bars not yet fetched: the bars of each symbol that was a member between the
    dates as trainers.lstm.job.point_in_time will cut them: its membership's trading days, the history its first
    sample reads before it and the horizon after, within the dates. The plan once counted every member over ten
    years with the whole ten years of bars (862 symbols, most of them in the index for part of it)."""
    import pandas as pd

    from trainers.lstm.config import resolve_timeframes
    from trainers.lstm.features import higher_history_bars
    from trainers.market.pit import load_history, membership_mask
    from trainers.market.sources import TRADING_DAYS, WEEKDAYS_A_YEAR
    from trainers.market.windows import LOOKBACK

    days = pd.bdate_range(start[:10], end[:10], inclusive="left")
    member = membership_mask(load_history(), days, symbols)
    inside = member.any(axis=0)
    if not inside.any():
        raise UsageError(f"--universe sp500-pit: none of the {len(symbols)} symbol(s) was in the S&P 500 between "
                         f"{start[:10]} and {end[:10]}: nothing to plan")
    first = member.argmax(axis=0)[inside]
    last = len(days) - 1 - member[::-1].argmax(axis=0)[inside]
    to_bars = TRADING_DAYS / WEEKDAYS_A_YEAR  # weekdays to sessions
    reach = cfg.window - 1 + LOOKBACK + higher_history_bars(resolve_timeframes(cfg.timeframes, Timeframe(1, "d")))
    lo = np.maximum(0, first - reach / to_bars)  # (in weekdays: the history before the first sample, within the
    hi = np.minimum(len(days), last + 1 + cfg.horizon / to_bars)  # dates; the horizon after the last)
    return [int(n) for n in np.round((hi - lo) * to_bars)]


def train_samples(cfg: LstmConfig, bars: int, base: Timeframe) -> int:
    """A symbol's training windows an epoch, as the job splits its bars (window, lookback, the higher timeframes'
    history, horizon, two embargoes); days x (1 - val - test) counted 1,764 where the job trains 1,391."""
    from trainers.lstm.config import resolve_timeframes
    from trainers.lstm.features import plan_symbol_splits

    try:
        start, end = plan_symbol_splits("plan", bars, cfg, resolve_timeframes(cfg.timeframes, base)).ranges["train"]
    except UsageError:
        return 0
    return end - start


def cohort_seconds(cohorts_of: list[int], steps: int, step_s: float, held_each: float) -> list[float]:
    """Each of a worker's cohorts' time, as the plan counts it: its steps (`step_s` the largest cohort's; a smaller
    one takes its members' share) and its own time and its members' outside them."""
    if max(cohorts_of) == 1:
        return [steps * step_s + SYMBOL_RUN_S - held_each for _ in cohorts_of]
    return [COHORT_RUN_S + n * (COHORT_SYMBOL_RUN_S - held_each)
            + steps * max(SMALL_STEP_S, step_s * n / max(cohorts_of))  # (a small cohort: at least the launch floor)
            for n in cohorts_of]


def export_cost(cfg: LstmConfig, symbols: int, workers: int, cohorts_of: list[int], cohort_s: list[float]
                ) -> tuple[float, str]:
    """The exports' time the job waits for (all its workers', as outside_steps_s counts) and the plan's note: in the
    worker, each worker's first exports and every symbol's; behind the training, what each worker's exporter has
    left when the worker's training ends."""
    if not cfg.export:
        return 0.0, ""
    if exports_behind(cfg.export_behind, cfg.device != "cpu", cfg.export):  # a plan is a GPU's
        ends = list(itertools.accumulate(cohort_s))
        after = exports_after_training_s(list(zip(ends, cohorts_of)), ends[-1], EXPORT_WORKER_S, EXPORT_BEHIND_SYMBOL_S)
        return max(1, workers) * after, (f"; ONNX export behind the training, {EXPORT_WORKER_S:.1f} s an exporter's "
                                          f"first and {EXPORT_BEHIND_SYMBOL_S:.3f} s a symbol (fitted to one H200 job),"
                                          f" {after:.1f} s of it after a worker's training")
    return max(1, workers) * EXPORT_WORKER_S + symbols * EXPORT_SYMBOL_S, (
        f"; ONNX export {EXPORT_WORKER_S:.1f} s a worker (the development VM's CPU) and {EXPORT_SYMBOL_S:.3f} s a "
        f"symbol (the H200 host's)")


def held_saves_s(cfg: LstmConfig, steps_per_epoch: int) -> float:
    """What holding a symbol's new bests saves it (HELD_SAVES_PER_EVAL_S for each evaluation before its last), 0
    where nothing is held: --ckpt-at-eval improved/always, or a step cadence as frequent as the evaluations."""
    if cfg.ckpt_at_eval != "held":
        return 0.0
    steps = steps_per_epoch * cfg.epochs
    between = steps_per_epoch if cfg.eval_every == 0 else cfg.eval_every
    if cfg.ckpt_every and cfg.ckpt_every <= between:
        return 0.0
    evaluations = cfg.epochs if cfg.eval_every == 0 else math.ceil(steps / cfg.eval_every)  # (and the last step)
    # at most the saving of the measured job's evaluations: the time a symbol's run spends outside its steps
    # (SYMBOL_RUN_S, COHORT_SYMBOL_RUN_S) was measured at 5 epochs and does not grow with more evaluations in this
    # model, so what holding saves of it cannot either (500 epochs made the job's time outside its steps negative)
    return HELD_SAVES_PER_EVAL_S * max(0, min(evaluations, MEASURED_EVALUATIONS) - 1)


def exports_after_training_s(finished: list[tuple[float, int]], train_s: float, first_s: float,
                             per_symbol_s: float) -> float:
    """How long one worker's exporter goes on after its training (`train_s`): `finished` holds each cohort's end
    and its symbols, in order; the exporter starts on a cohort when it ends (or when it is free), its first
    exports take `first_s` once, then `per_symbol_s` a symbol."""
    free = None
    for at, symbols in finished:
        free = (at + first_s if free is None else max(free, at)) + symbols * per_symbol_s
    return max(0.0, (free or 0.0) - train_s)


def planned_cohort(cfg: LstmConfig, stacked_per_sample: float, symbols: int, memory_bytes: int) -> int:
    """The largest cohort a GPU job's worker forms: --cohort, else what cohort_size gives a card of
    `memory_bytes`, never more than the worker's symbols."""
    if cfg.cohort is not None:
        return max(1, min(cfg.cohort, symbols))
    per_member = cfg.batch_size * stacked_per_sample
    return max(1, min(MAX_AUTO_COHORT, symbols, auto_cohort(memory_bytes, cfg.jobs_per_gpu, per_member)))


MAX_AUTO_COHORT = 256  # past this a step's kernels are already wide; more only delays each symbol's first result
COHORT_MEMORY_SHARE = 0.5  # of the GPU's memory, for the cohort's saved activations (the rest: data, workers)


def cohort_size(cfg: LstmConfig, timeframes: list, device) -> int:
    """Symbols a worker trains at once (`--cohort`): the user's number, else 1 on a CPU (a stacked step
    is no faster there: tests/lstm/lstm_cohort_cpu.json) and on a GPU as many cohort members as half its
    memory holds for their activations (shared by the workers on it), at most MAX_AUTO_COHORT."""
    from trainers.runtime import device as device_mod

    if cfg.cohort is not None:
        return cfg.cohort
    total = device_mod.total_memory(device)
    if not total:  # a CPU
        return 1
    per_member = cfg.batch_size * stacked_saved_bytes_per_sample(cfg, n_features(len(timeframes)))
    return max(1, min(MAX_AUTO_COHORT, auto_cohort(total, cfg.jobs_per_gpu, per_member)))


def auto_cohort(memory_bytes: int, jobs_per_gpu: int | None, per_member_bytes: float) -> int:
    """Members whose activations COHORT_MEMORY_SHARE of a GPU's memory holds, shared by its workers."""
    return int(memory_bytes * COHORT_MEMORY_SHARE / max(1, jobs_per_gpu or 1) // max(per_member_bytes, 1.0))


def stacked_saved_bytes_per_sample(cfg: LstmConfig, features: int) -> float:
    """Bytes autograd saves per sample of one cohort member (measured on a stack of one, on the CPU)."""
    import torch

    from trainers.lstm.stacked import StackedLSTM

    model = StackedLSTM(1, features, cfg.hidden, cfg.layers, cfg.dropout).train()
    return saved_bytes_per_item(model, lambda b: (torch.randn(1, b, cfg.window, features),))
