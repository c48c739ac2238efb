"""The forecaster's data: market source -> panel -> causal features -> windows gathered by index.

A sample is (anchor date t, ticker n); its input is the normalised feature rows t-window+1..t of
ticker n and its target the log return over the next `horizon` days. Every tensor lives on the
training device and a batch is gathered by sample id, never built in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from trainers.errors import UsageError
from trainers.forecast.config import ForecastConfig
from trainers.market.panel import Panel, to_panel
from trainers.market.sources import DataRequest, load_source
from trainers.market.universe import resolve_tickers
from trainers.market.windows import (
    CLIP,
    FEATURES,
    LOOKBACK,
    SPLITS,
    SplitPlan,
    causal_features,
    plan_splits,
    window_complete,
)


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
    """Real data: pin start/end on the first run so a resume next week reads the same dates. A
    file is used whole unless --start/--end/--years say otherwise (its dates do not move)."""
    if cfg.source == "synthetic":
        return
    if cfg.source.startswith("file:") and not (cfg.start or cfg.end or cfg.years):
        return
    if saved is not None:
        cfg.start = cfg.start or saved.get("start")
        cfg.end = cfg.end or saved.get("end")
    else:
        cfg.start, cfg.end = data_request(cfg).date_range()


@dataclass
class WindowStore:
    """All tensors on one device; a batch is gathered by sample id, never built in Python."""

    features: torch.Tensor  # [dates, tickers, F] normalised, NaN -> 0
    target: torch.Tensor  # [dates, tickers] forward log return over horizon (NaN -> 0)
    past_return: torch.Tensor  # [dates, tickers] log return over the previous `horizon` days
    sample_ids: dict[str, torch.Tensor]  # split -> flat ids (t * n_tickers + n), sorted
    window: int
    horizon: int
    n_tickers: int
    dates: list[str]
    tickers: list[str]
    plan: SplitPlan
    feature_mean: list[float]
    feature_std: list[float]
    target_mean: float
    target_std: float
    stats: dict = field(default_factory=dict)

    def to(self, device: torch.device) -> "WindowStore":
        self.features = self.features.to(device)
        self.target = self.target.to(device)
        self.past_return = self.past_return.to(device)
        self.sample_ids = {k: v.to(device) for k, v in self.sample_ids.items()}
        return self

    def gather(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs [B, window, F] and targets [B] for flat sample ids."""
        t = torch.div(ids, self.n_tickers, rounding_mode="floor")
        n = ids - t * self.n_tickers
        rows = t[:, None] + torch.arange(-self.window + 1, 1, device=ids.device)[None, :]
        return self.features[rows, n[:, None]], self.target[t, n]

    def date_index(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.div(ids, self.n_tickers, rounding_mode="floor")

    def preprocessing(self) -> dict:
        """What a consumer of the exported model needs to build its inputs."""
        return {"features": list(FEATURES), "feature_mean": self.feature_mean, "feature_std": self.feature_std,
                "clip": CLIP, "window": self.window, "horizon": self.horizon, "lookback": LOOKBACK,
                "target": f"log(close[t+{self.horizon}] / close[t])",
                "target_mean": self.target_mean, "target_std": self.target_std}




def build_store(panel: Panel, window: int, horizon: int, val_frac: float = 0.15, test_frac: float = 0.15,
                min_split_dates: int = 20) -> WindowStore:
    if window < 2:
        raise UsageError(f"--window {window} must be >= 2 days")
    if horizon <= 0:
        raise UsageError(f"--horizon {horizon} must be > 0 days")
    n_dates, n_tickers = panel.shape
    plan = plan_splits(n_dates, window, horizon, val_frac, test_frac, min_split_dates)
    feats = causal_features(panel)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_close = np.log(panel.close)
    target = np.full((n_dates, n_tickers), np.nan)
    target[:-horizon] = log_close[horizon:] - log_close[:-horizon]
    past = np.full((n_dates, n_tickers), np.nan)
    past[horizon:] = log_close[horizon:] - log_close[:-horizon]

    row_ok = np.isfinite(feats).all(axis=-1)
    valid = window_complete(row_ok, window) & np.isfinite(target) & np.isfinite(past)

    # Normalisation statistics from the training period only: rows up to the last train anchor.
    train_start, train_stop = plan.ranges["train"]
    train_rows = feats[: train_stop].reshape(-1, len(FEATURES))
    mean = np.nanmean(train_rows, axis=0)
    std = np.nanstd(train_rows, axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    norm = np.clip((feats - mean) / std, -CLIP, CLIP)
    norm = np.nan_to_num(norm, nan=0.0)

    sample_ids = {}
    for split in SPLITS:
        start, stop = plan.ranges[split]
        mask = np.zeros_like(valid)
        mask[start:stop] = valid[start:stop]
        sample_ids[split] = torch.from_numpy(np.flatnonzero(mask.ravel()).astype(np.int64))
        if len(sample_ids[split]) == 0:
            raise UsageError(f"the {split} split has no complete sample (every window or target has gaps); "
                             f"check the data or use a shorter --window")
    train_targets = target.ravel()[sample_ids["train"].numpy()]
    return WindowStore(
        features=torch.from_numpy(norm.astype(np.float32)),
        target=torch.from_numpy(np.nan_to_num(target).astype(np.float32)),
        past_return=torch.from_numpy(np.nan_to_num(past).astype(np.float32)),
        sample_ids=sample_ids, window=window, horizon=horizon, n_tickers=n_tickers,
        dates=[d.strftime("%Y-%m-%d") for d in panel.dates], tickers=list(panel.tickers), plan=plan,
        feature_mean=mean.tolist(), feature_std=std.tolist(),
        target_mean=float(train_targets.mean()), target_std=float(train_targets.std() or 1.0),
        stats={s: int(len(v)) for s, v in sample_ids.items()},
    )


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
