"""The forecaster's options: one dataclass, the command line, config.json and every checkpoint.

No torch or pandas here: `trainers forecast train --help` must answer at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainers.errors import UsageError
from trainers.runtime.config import option
from trainers.runtime.options import PRECISIONS, RunOptions


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
        from trainers.market.sources import check_source

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
