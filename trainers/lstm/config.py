"""The per-symbol LSTM's options and the timeframe grammar (symbols are spelled and checked by
trainers.market.symbols, as for every trainer).

No torch or pandas here: `trainers lstm train --help` must answer at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainers.errors import UsageError
from trainers.market.symbols import parse_symbols
from trainers.runtime.config import MAX_YEARS, option
from trainers.runtime.options import CKPT_AT_EVAL, RunOptions

# Timeframes: N minutes/hours, 1 day, 1 week (Monday to Sunday), 1 calendar month.
TIMEFRAME_RE = re.compile(r"^([1-9][0-9]*)(m|h|d|w|M)$")
MINUTES = {"m": 1, "h": 60, "d": 1440, "w": 10080}
DAY = 1440
# `--timeframes auto`: the base bars and the usual higher timeframes for them
AUTO_TIMEFRAMES = {"1d": "1d,1w,1M", "1h": "1h,4h,1d", "1m": "1m,15m,1h,4h"}


def job_symbols(job: dict, symbols: str | None) -> list[str]:
    """The symbols of a job's results.json that `--symbols` names (all of them when None); one line
    naming any the job does not have."""
    have = job.get("symbols", {})
    wanted = parse_symbols(symbols) if symbols is not None else list(have)  # '' is refused, not "all"
    unknown = [s for s in wanted if s not in have]
    if unknown:
        raise UsageError(f"--symbols {', '.join(unknown)}: not in this job (it has {', '.join(have)})")
    return wanted


@dataclass(frozen=True)
class Timeframe:
    n: int
    unit: str  # m h d w M

    @property
    def label(self) -> str:
        return f"{self.n}{self.unit}"

    @property
    def minutes(self) -> int | None:
        """Fixed length in minutes (None for calendar months)."""
        return None if self.unit == "M" else self.n * MINUTES[self.unit]

    @property
    def nominal_minutes(self) -> int:
        return self.minutes if self.minutes is not None else 31 * DAY


def parse_timeframe(text: str, where: str = "--timeframes") -> Timeframe:
    m = TIMEFRAME_RE.match(text.strip())
    if m is None:
        raise UsageError(f"{where}: {text!r} is not a timeframe like 1m, 15m, 1h, 4h, 1d, 1w or 1M")
    tf = Timeframe(int(m.group(1)), m.group(2))
    if tf.unit in ("d", "w", "M") and tf.n != 1:
        raise UsageError(f"{where}: {text!r}: days, weeks and months come one at a time (1d, 1w, 1M)")
    if tf.unit in ("m", "h") and DAY % tf.minutes:
        raise UsageError(f"{where}: {text!r} does not divide a day, so its bars would not start at midnight; "
                         f"use e.g. 5m, 15m, 1h, 4h")
    return tf


def parse_timeframes(text: str) -> list[Timeframe] | None:
    """None for `auto` (chosen from the base bars); else the parsed list, strictly increasing."""
    if text.strip() == "auto":
        return None
    tfs = [parse_timeframe(t) for t in text.split(",") if t.strip()]
    if not tfs:
        raise UsageError(f"--timeframes {text!r} lists no timeframe")
    for a, b in zip(tfs, tfs[1:]):
        if b.nominal_minutes <= a.nominal_minutes:
            raise UsageError(f"--timeframes {text!r}: list them from the base bars up, each longer than the one "
                             f"before ({a.label} then {b.label})")
    return tfs


def resolve_timeframes(text: str, base: Timeframe) -> list[Timeframe]:
    """The timeframes for bars of interval `base`: the first must be the base, every other a whole
    number of base bars (months and weeks need a base that divides a day)."""
    tfs = parse_timeframes(text)
    if tfs is None:
        if base.label not in AUTO_TIMEFRAMES:
            return [base] + ([parse_timeframe("1d")] if base.minutes < DAY else [])
        tfs = parse_timeframes(AUTO_TIMEFRAMES[base.label])
    if tfs[0] != base:
        raise UsageError(f"--timeframes {text!r}: the first timeframe must be the base bars' interval, "
                         f"{base.label} for this data (e.g. --timeframes {AUTO_TIMEFRAMES.get(base.label, base.label)})")
    for tf in tfs[1:]:
        fixed = tf.minutes if tf.minutes is not None else DAY  # a month is made of whole days
        if fixed % base.minutes or (tf.unit in ("w", "M") and DAY % base.minutes):
            raise UsageError(f"--timeframes: {tf.label} is not a whole number of {base.label} bars; every higher "
                             f"timeframe must divide into base bars")
    return tfs


def n_features(n_timeframes: int) -> int:
    """5 features of the base bars + 3 per higher timeframe (see trainers.lstm.features): the count
    with every column present, what the planner sizes; a close-only symbol's model has fewer."""
    return 5 + 3 * (n_timeframes - 1)


@dataclass
class LstmConfig(RunOptions):
    # where the folder is now: `x`, `./x`, its absolute path or a moved copy are the same job
    run_dir: str = option("runs/lstm", "job folder: a run folder per symbol under symbols/, the summary beside them",
                          resume_safe=True)
    # symbols and data
    symbols: str | None = option(None, "comma-separated symbols, e.g. AAPL,BRK-B or BTC-USD (default: every symbol "
                                 "the source has; --universe for yfinance)", resume_safe=True)
    tickers_file: str | None = option(None, "file of symbols, one per line (or a CSV with a symbol column)",
                                      resume_safe=True)
    universe: str = option("sp500", "symbols for --source yfinance when none are given: sp500 (today's members) or "
                           "sp500-pit (every member of the index's history over the dates; each symbol's samples "
                           "only on the dates it was a member, with a file or the cache too)",
                           choices=("sp500", "sp500-pit"))
    source: str = option("synthetic", "bars: synthetic, yfinance (daily, cached), cache (daily) or file:PATH "
                         "(CSV/parquet with date[+time], ticker, close and, when it has them, open, high, low, "
                         "volume: features that need a missing one are left out; minute, hour or daily bars)")
    cache_dir: str = option("cache/sp500", "parquet price cache of the yfinance and cache sources", resume_safe=True)
    years: float = option(10.0, "history for yfinance/cache when --start is not given", gt=0, max=MAX_YEARS)
    start: str | None = option(None, "first date (YYYY-MM-DD); fixed in config.json on the first run", date=True)
    end: str | None = option(None, "end date, exclusive (default: today); fixed in config.json on the first run",
                             after="start")
    synthetic_tickers: int = option(8, "symbols in the synthetic market (SYN000...)", min=1)
    synthetic_days: int = option(2520, "trading days in the synthetic market", min=1)
    data_seed: int = option(0, "seed of the synthetic market", min=0)
    synthetic_momentum: float = option(0.3, "strength of the synthetic market's momentum effect (0: none)",
                                       min=-10, max=10)
    timeframes: str = option("auto", "base timeframe then higher ones, e.g. 1d,1w,1M for daily bars or 1h,4h,1d for "
                             "hourly ones (auto: those two, or 1m,15m,1h,4h for minute bars)")
    window: int = option(64, "input window in base bars", min=2)
    horizon: int = option(1, "target: direction of the log return over this many base bars", min=1)
    dead_zone: float = option(0.0, "returns with |log return| <= this get no label (not trained or scored on)", min=0)
    val_frac: float = option(0.15, "share of usable bars for validation", gt=0, lt=1)
    test_frac: float = option(0.15, "share of usable bars for test", gt=0, lt=1)
    min_split_bars: int = option(20, "fewest anchor bars each split may have", min=1)
    # model
    # (ceilings: a per-symbol direction model of hidden 4096 x 16 layers is ~2 billion parameters already; above,
    # every symbol was tried twice and failed out of memory, where the user wants one line before anything runs)
    hidden: int = option(64, "LSTM hidden size", min=1, max=4096)
    layers: int = option(2, "stacked LSTM layers", min=1, max=16)
    dropout: float = option(0.1, "dropout between LSTM layers and before the head", min=0, lt=1)
    # optimisation
    epochs: int = option(20, "passes over each symbol's training split", min=1)
    max_steps: int | None = option(None, "stop each symbol after this many optimizer steps", min=1)
    batch_size: int = option(256, "windows per optimizer step", min=1)
    lr: float = option(1e-3, "AdamW learning rate", gt=0)
    weight_decay: float = option(0.0, "AdamW weight decay", min=0)
    grad_clip: float = option(1.0, "clip the gradient norm to this (0: off)", min=0)
    class_weights: bool = option(True, "weigh the loss of up bars by n_down/n_up of the training split")
    seed: int = option(0, "seed of init and shuffling (each symbol offsets it by a hash of its name)", min=0)
    # evaluation, export, packing
    cost_bps: float = option(5.0, "cost of the long/flat strategy per unit of position change, basis points",
                             resume_safe=True, min=0)
    calibration_bins: int = option(10, "equal-count bins of the calibration table", resume_safe=True, min=2)
    eval_every: int = option(0, "evaluate validation loss every N steps (0: at each epoch end)", resume_safe=True,
                             min=0)
    ckpt_at_eval: str = option("held", "which evaluations also checkpoint: held (a new best held in host memory and "
                               "written with the symbol's next checkpoint, at its end, a stop or --ckpt-every: a kill "
                               "redoes its steps since the last one written, seconds of work, where writing every new "
                               "best cost each symbol about four writes), improved (each new best written) or always",
                               resume_safe=True, choices=CKPT_AT_EVAL)
    eval_batch_size: int = option(1024, "windows per evaluation batch", resume_safe=True, min=1)
    export: bool = option(True, "export each finished symbol's ONNX as it finishes (in its worker, or behind it: "
                          "--export-behind); `trainers lstm export` exports the symbols marked done without one, and "
                          "the same train command finishes and exports those a stop left unmarked", resume_safe=True)
    export_behind: bool | None = option(None, "export in a process of its own while the worker trains its next "
                                        "symbols (default: on a GPU deploy, --gpu-defaults included; on a CPU in "
                                        "the worker, where an exporter would take cores from the training)",
                                        resume_safe=True)
    cohort: int | None = option(None, "symbols a worker trains at once as one stacked model, each still its own run "
                                "(folder, checkpoints, early stop, results); 1: one at a time with nn.LSTM "
                                "(default: 1 on CPU, where stacking does not pay; on a GPU as many as the plan "
                                "fits, at most 256)", resume_safe=True, min=1, max=4096)
    jobs_per_gpu: int = option(1, "workers sharing one GPU: start torchrun with K x GPUs workers per node "
                               "(deploy_8gpu.sh does); worker r uses GPU r // K", resume_safe=True, min=1)

    def for_attempt(self, restart_count: int) -> "LstmConfig":
        """A symbol's run restarts as its marker says (trainers.lstm.queue.mark_restart, Worker.once), on any
        attempt: the job marks its symbols once, on torchrun's first attempt."""
        return self

    def validate(self) -> None:
        """Cheap checks that need no data; run before anything touches the disk."""
        self.validate_run_options()  # every field's type, range and choices
        from trainers.market.sources import check_source

        check_source(self.source)
        if self.val_frac + self.test_frac >= 1:
            raise UsageError(f"--val-frac {self.val_frac} and --test-frac {self.test_frac} must sum to less than 1")
        if self.export_behind and not self.export:
            raise UsageError("--export-behind exports each symbol in a process of its own; with --no-export there is "
                             "nothing to export: drop one of them")
        if self.symbols is not None and self.tickers_file is not None:
            raise UsageError("give --symbols or --tickers-file, not both")
        if self.universe == "sp500-pit" and self.source == "synthetic":
            raise UsageError("--universe sp500-pit keeps each symbol to the dates it was in the S&P 500; the synthetic "
                             "market has no members (use --source yfinance, cache or file:PATH)")
        if self.symbols is not None:  # --symbols '' must not quietly mean every symbol
            parse_symbols(self.symbols)
        parse_timeframes(self.timeframes)
