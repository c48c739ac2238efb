"""The forecaster's options: one dataclass, the command line, config.json and every checkpoint.

No torch or pandas here: `trainers forecast train --help` must answer at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainers.errors import UsageError
from trainers.runtime.config import MAX_YEARS, SYNTHETIC_MAX_CELLS, SYNTHETIC_MAX_DAYS, check_product, option
from trainers.runtime.options import PRECISIONS, RunOptions

TARGETS = ("raw", "demeaned", "rank")
UNIVERSES = ("sp500", "sp500-pit")  # trainers.market.universe.UNIVERSES, named here without importing pandas
SYNTHETIC_EFFECTS = ("momentum", "regime")  # trainers.market.synthetic.EFFECTS (no pandas here either)
READOUTS = ("last", "mean", "attention")  # trainers.forecast.model's (no torch here)
ENCODERS = ("transformer", "none")
# What a run folder written before these model options existed was trained with: its config.json
# lacks them, and evaluate/export must rebuild exactly that model (a resume is refused, as for any
# field the saved config lacks).
LEGACY_MODEL = {"readout": "last", "linear_skip": False, "past_returns": False, "encoder": "transformer"}


@dataclass(frozen=True)
class ForecasterShape:
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int


PRESETS: dict[str, ForecasterShape] = {
    "tiny": ForecasterShape(d_model=32, n_layers=2, n_heads=4, d_ff=64),
    "small": ForecasterShape(d_model=256, n_layers=4, n_heads=8, d_ff=1024),
    "base": ForecasterShape(d_model=512, n_layers=8, n_heads=8, d_ff=2048),
    "151m": ForecasterShape(d_model=1024, n_layers=12, n_heads=16, d_ff=4096),  # seed 000's size
}


@dataclass
class ForecastConfig(RunOptions):
    run_dir: str = option("runs/forecast", "run folder: checkpoints, logs, results (resumed if it holds a run)",
                          resume_safe=True)  # where the folder is now: it may have been moved
    # data
    source: str = option("synthetic", "market data: synthetic, yfinance (fetch missing into the cache), cache, "
                         "or file:PATH (a long CSV/parquet table: date, ticker, close, and open, high, low, volume when it has them)")
    universe: str = option("sp500", "ticker universe when no --tickers are given: sp500 (today's members; "
                           "yfinance only) or sp500-pit (every member of the index's history, each used only "
                           "on the dates it was in the index; any real source)", choices=UNIVERSES)
    tickers: str | None = option(None, "comma-separated symbols, e.g. AAPL,MSFT,BRK-B")
    tickers_file: str | None = option(None, "file of symbols, one per line (or a CSV with a symbol column)")
    cache_dir: str = option("cache/sp500", "parquet price cache of the yfinance and cache sources", resume_safe=True)
    years: float | None = option(None, "history to use when --start is not given (default: 25 years from "
                                 "yfinance or a cache; a file's whole history)", gt=0, max=MAX_YEARS)
    start: str | None = option(None, "first date (YYYY-MM-DD); fixed in config.json on the first run", date=True)
    end: str | None = option(None, "end date, exclusive (default: today); fixed in config.json on the first run",
                             after="start")
    min_history_days: int = option(252, "tickers with fewer valid bars are excluded", min=1)
    synthetic_tickers: int = option(48, "tickers in the synthetic market", min=1)
    synthetic_days: int = option(2520, "trading days in the synthetic market", min=1, max=SYNTHETIC_MAX_DAYS)
    data_seed: int = option(0, "seed of the synthetic market", min=0)
    synthetic_momentum: float = option(0.08, "strength of the synthetic market's momentum effect (0: none, the "
                                       "control a model must show no skill on; < 0: reversal)", min=-10, max=10)
    synthetic_effect: str = option("momentum", "shape of the synthetic market's effect: momentum (linear in the "
                                   "past returns) or regime (momentum that reverses while a stock's 20-day "
                                   "volatility is above its 70th percentile: no linear model can express it)",
                                   choices=SYNTHETIC_EFFECTS)
    features: str | None = option(None, "comma-separated input features (default: every one the data's columns "
                                  "allow: ret_1d, range_hl, ret_oc, volume_z, vol_20d); fixed in config.json on "
                                  "the first run")
    target: str = option("rank", "what the model learns: raw (the forward log return), demeaned (minus the "
                         "date's mean over tickers) or rank (its rank among the date's tickers in [-1, 1])",
                         choices=TARGETS)
    window: int = option(60, "input window in trading days", min=2)
    horizon: int = option(20, "forecast horizon in trading days (target: log return over it)", min=1)
    val_frac: float = option(0.15, "share of usable dates for validation", gt=0, lt=1)
    test_frac: float = option(0.15, "share of usable dates for test", gt=0, lt=1)
    min_split_dates: int = option(20, "fewest anchor dates each split may have", min=1)
    walk_forward: int = option(0, "K expanding-window folds, each with its own train/val/test, embargo and "
                               "normalisation, trained in turn in <run-dir>/fold_<k> (0: one plain split)", min=0)
    fold: int | None = option(None, "with --walk-forward: train only this fold (0 = earliest) in --run-dir itself",
                              min=0)
    # evaluation (may change on resume: they do not touch training)
    top_k: int | None = option(None, "names held long (and short) by the evaluation portfolios (default: a fifth "
                               "of the names on each rebalance date)", resume_safe=True, min=1)
    cost_bps: float = option(10.0, "trading cost in basis points of the notional traded, charged at every "
                             "rebalance of the evaluation portfolios", resume_safe=True, min=0, max=10000)
    # model
    preset: str = option("tiny", "model size", choices=tuple(PRESETS))
    dropout: float = option(0.1, "dropout on the residual branches", min=0, lt=1)
    readout: str = option("last", "what the score is read from: the anchor day's state (last), the mean over the "
                          "window (mean) or a learned weighting of the days (attention)", choices=READOUTS)
    linear_skip: bool = option(False, "add a linear map of the flattened window to the score (ridge's inputs: the "
                               "model holds a linear model as a special case)")
    # The defaults (last-day readout, no skip, past returns) are the ablation row with the highest
    # validation Rank IC (bench/forecast_ablation.py's `choose`; the test split was not read).
    past_returns: bool = option(True, "an extra input channel: the return from each day of the window to the "
                                "anchor (from ret_1d), the trailing return persistence scores by")
    encoder: str = option("transformer", "transformer, or none: the linear skip alone (a linear model trained "
                          "the model's way; an ablation)", choices=ENCODERS)
    # optimisation
    epochs: int = option(4, "passes over the training split", min=1)
    max_steps: int | None = option(None, "stop after this many optimizer steps", min=1)
    batch_size: int = option(256, "samples per rank per micro-batch", min=1)
    grad_accum: int = option(1, "micro-batches per optimizer step", min=1)
    # 1e-3 and 2e-3 gave the same validation Rank IC on the demo market (0.137 vs 0.132 after 4 epochs,
    # bench/results/forecast_readout_cpu.json), so one peak LR for every preset
    lr: float = option(1e-3, "peak learning rate", gt=0)
    min_lr_ratio: float = option(0.1, "final LR as a share of the peak (cosine floor)", min=0, max=1)
    warmup_steps: int = option(50, "linear warmup steps", min=0)
    weight_decay: float = option(0.1, "AdamW weight decay on matrices", min=0)
    grad_clip: float = option(1.0, "clip the global gradient norm to this (0: off)", min=0)
    seed: int = option(0, "seed of model init and shuffling (each rank offsets it by its rank)", min=0)
    # runtime
    precision: str = option("auto", "auto: bf16 on Ampere+, fp16 + grad scaler on older GPUs, fp32 on CPU",
                            choices=PRECISIONS)
    compile: bool | None = option(None, "torch.compile the train step (model + loss); default: on with CUDA, off "
                                  "on CPU", resume_safe=True)
    # stops, checkpoints, logging
    eval_every: int = option(0, "evaluate validation loss every N steps (0: at each epoch end)", resume_safe=True,
                            min=0)
    eval_batch_size: int = option(1024, "samples per rank per evaluation batch", resume_safe=True, min=1)

    def validate(self) -> None:
        """Cheap checks that need no data; run before anything touches the disk."""
        self.validate_run_options()  # every field's type, range and choices
        if self.remote is not None and self.walk_forward:
            raise UsageError(f"--remote with --walk-forward {self.walk_forward} is not supported yet: mirror a plain "
                             f"run, or put the run folder on a mounted volume")
        from trainers.market.sources import check_source

        check_source(self.source)
        if self.val_frac + self.test_frac >= 1:
            raise UsageError(f"--val-frac {self.val_frac} and --test-frac {self.test_frac} must sum to less than 1")
        if self.source == "synthetic":
            check_product(self, ("synthetic_tickers", "synthetic_days"), SYNTHETIC_MAX_CELLS, "prices to generate")
        if self.universe == "sp500-pit" and self.source == "synthetic":
            raise UsageError("--universe sp500-pit needs real prices: --source yfinance, cache or file:PATH")
        if self.fold is not None and not self.fold < self.walk_forward:
            raise UsageError(f"--fold {self.fold} needs --walk-forward K with K > {self.fold}")
        if self.features is not None:  # pinned in config.json: " a , b " and "a,b" are the same list
            self.features = ",".join(feature_names(self))
        if self.past_returns and self.features is not None and "ret_1d" not in feature_names(self):
            raise UsageError(f"--past-returns sums ret_1d, which --features {self.features} leaves out; add it "
                             f"or use --no-past-returns")
        if self.encoder == "none" and not self.linear_skip:
            raise UsageError("--encoder none leaves only the linear skip to forecast: add --linear-skip")
        if self.synthetic_effect != "momentum" and self.source != "synthetic":
            raise UsageError(f"--synthetic-effect {self.synthetic_effect} shapes the synthetic market; --source "
                             f"{self.source} has its own prices")


def legacy_model_fields(saved: dict) -> dict:
    """The model options a config.json written before they existed was trained with (see
    LEGACY_MODEL): those it lacks, at their old values."""
    return {name: value for name, value in LEGACY_MODEL.items() if name not in saved}


def refuse_legacy_resume(run_dir, saved: dict | None) -> None:
    """A run folder from before the model options: its config lacks them, so resuming is refused
    (the runtime refuses any field the saved config lacks); say why in the forecaster's words."""
    missing = legacy_model_fields(saved) if saved is not None else {}
    if missing:
        flags = ", ".join("--" + name.replace("_", "-") for name in missing)
        raise UsageError(f"--run-dir {run_dir} holds a run trained before {flags} existed (its config.json lacks "
                         f"them): it cannot be resumed; `trainers forecast evaluate` and `export` still read it "
                         f"(as {', '.join(f'{k}={v}' for k, v in missing.items())}); train in a new --run-dir")


def feature_names(cfg: ForecastConfig) -> list[str]:
    """The model's input features: --features, or all of them (what a run without data, like
    preflight's size check, assumes)."""
    return named_features(cfg.features)


def named_features(text: str | None) -> list[str]:
    """A --features list read: None is every feature."""
    from trainers.market.windows import FEATURES

    if text is None:
        return list(FEATURES)
    names = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in names if f not in FEATURES]
    if unknown or not names or len(set(names)) != len(names):
        raise UsageError(f"--features {text!r}: give distinct names from {', '.join(FEATURES)}")
    return names


def refuse_steps_larger_than_the_split(cfg: ForecastConfig, world_size: int, n_train: int) -> None:
    """Accumulating over more samples than the training split holds makes every step the whole split,
    cut into micro-batches of a sample or two, each padded to --batch-size: --grad-accum 100000 ran for
    minutes before anything failed. One batch larger than the split stays allowed (it is the split)."""
    per_step = cfg.batch_size * cfg.grad_accum * world_size
    if cfg.grad_accum > 1 and per_step > n_train:
        most = max(1, n_train // (cfg.batch_size * world_size))
        raise UsageError(f"--grad-accum {cfg.grad_accum} with --batch-size {cfg.batch_size} on {world_size} rank(s) "
                         f"makes a step of {per_step:,} samples, but the training split has {n_train:,}; "
                         f"use --grad-accum {most} or less")
