"""Causal features, chronological splits with an embargo, and a window store gathered by index.

A sample is (anchor date t, ticker n): the input is the feature rows t-window+1 .. t of ticker n,
the target is log(close[t+horizon] / close[t]). Features at day t use bars up to day t only.
Anchors are split by date into train / validation / test; between two parts lie `embargo` dates
with no anchor, and embargo >= window + horizon + feature lookback, so no input row or target day
of one part is an input row or target day of another (tests/test_windows.py proves it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from trainers.data.market import Panel
from trainers.errors import UsageError

FEATURES = ("ret_1d", "range_hl", "ret_oc", "volume_z", "vol_20d")
LOOKBACK = 20  # longest trailing statistic in the features (days before the first window row)
SPLITS = ("train", "val", "test")


def _trailing_mean(x: np.ndarray, n: int) -> np.ndarray:
    """Mean of rows t-n+1..t (NaN where fewer than n rows or any NaN)."""
    out = np.full_like(x, np.nan)
    c = np.cumsum(np.nan_to_num(x), axis=0)
    bad = np.cumsum(~np.isfinite(x), axis=0)
    out[n - 1:] = c[n - 1:] - np.vstack([np.zeros((1, x.shape[1])), c[:-n]])
    nbad = bad[n - 1:] - np.vstack([np.zeros((1, x.shape[1])), bad[:-n]])
    out[n - 1:] /= n
    out[n - 1:][nbad > 0] = np.nan
    return out


def causal_features(p: Panel) -> np.ndarray:
    """[dates, tickers, features]; row t depends on bars 0..t only."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log_close = np.log(p.close)
        ret_1d = np.vstack([np.full((1, p.shape[1]), np.nan), np.diff(log_close, axis=0)])
        range_hl = np.log(p.high / p.low)
        ret_oc = np.log(p.close / p.open)
        log_vol = np.log1p(p.volume)
        volume_z = log_vol - _trailing_mean(log_vol, LOOKBACK)
        mean_r = _trailing_mean(ret_1d, LOOKBACK)
        vol_20d = np.sqrt(np.maximum(_trailing_mean(ret_1d**2, LOOKBACK) - mean_r**2, 0.0))
    feats = np.stack([ret_1d, range_hl, ret_oc, volume_z, vol_20d], axis=-1)
    feats[~np.isfinite(feats)] = np.nan
    return feats


@dataclass
class SplitPlan:
    """Anchor date index ranges [start, stop) per split, and the embargo between them."""

    ranges: dict[str, tuple[int, int]]
    embargo: int
    first_anchor: int
    last_anchor: int

    def footprint(self, split: str, window: int, horizon: int) -> tuple[int, int]:
        """First and last date index any sample of `split` reads (inputs incl. lookback, target)."""
        start, stop = self.ranges[split]
        return start - window + 1 - LOOKBACK, stop - 1 + horizon


def plan_splits(n_dates: int, window: int, horizon: int, val_frac: float, test_frac: float,
                min_split_dates: int) -> SplitPlan:
    embargo = window + horizon + LOOKBACK
    first = window - 1 + LOOKBACK  # earliest anchor with a full window of features
    last = n_dates - 1 - horizon  # latest anchor whose target exists
    usable = last - first + 1 - 2 * embargo
    n_val = int(round(usable * val_frac))
    n_test = int(round(usable * test_frac))
    n_train = usable - n_val - n_test
    if min(n_train, n_val, n_test) < min_split_dates:
        need = 2 * embargo + (first + 1) + horizon + min_split_dates * 3
        if window + LOOKBACK + horizon > n_dates:
            raise UsageError(f"--window {window} + --horizon {horizon} (+{LOOKBACK} feature lookback) is longer "
                             f"than the data ({n_dates} dates); use a shorter window or more history")
        raise UsageError(f"{n_dates} trading dates cannot hold train/val/test of >= {min_split_dates} anchor dates "
                         f"each with window {window}, horizon {horizon} and two embargoes of {embargo} dates; "
                         f"need about {need} dates (more history, a shorter --window/--horizon, or lower "
                         f"--min-split-dates)")
    a = first
    ranges = {"train": (a, a + n_train)}
    a += n_train + embargo
    ranges["val"] = (a, a + n_val)
    a += n_val + embargo
    ranges["test"] = (a, a + n_test)
    assert a + n_test - 1 == last
    return SplitPlan(ranges, embargo, first, last)


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


CLIP = 8.0  # normalised features are clipped to +-CLIP: fat tails must not blow up activations


def _window_ok(ok_rows: np.ndarray, window: int) -> np.ndarray:
    """ok[t] = all of rows t-window+1..t are ok (False for t < window-1)."""
    bad = np.cumsum(~ok_rows, axis=0)
    out = np.zeros_like(ok_rows)
    prev = np.vstack([np.zeros((1, ok_rows.shape[1]), dtype=bad.dtype), bad[:-window]])
    out[window - 1:] = (bad[window - 1:] - prev) == 0
    return out


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
    valid = _window_ok(row_ok, window) & np.isfinite(target) & np.isfinite(past)

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
