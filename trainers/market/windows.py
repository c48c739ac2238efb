"""Causal daily features and chronological splits with an embargo, shared by the market trainers.

A sample is (anchor date t, ticker n): the input is the feature rows t-window+1 .. t of ticker n,
the target is log(close[t+horizon] / close[t]). Features at day t use bars up to day t only.
Anchors are split by date into train / validation / test; between two parts lie `embargo` dates
with no anchor, and embargo >= window + horizon + feature lookback, so no input row or target day
of one part is an input row or target day of another (tests/unit/test_windows.py proves it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainers.errors import UsageError
from trainers.market.panel import Panel

FEATURES = ("ret_1d", "range_hl", "ret_oc", "volume_z", "vol_20d")
# The price columns each feature is computed from: a table without one of them (a close-only
# file) leaves those features out instead of filling them with made-up values.
FEATURE_INPUTS = {"ret_1d": ("close",), "range_hl": ("high", "low"), "ret_oc": ("open", "close"),
                  "volume_z": ("volume",), "vol_20d": ("close",)}
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


def absent_columns(p: Panel) -> list[str]:
    """Price columns with no value at all in the panel (a close-only file has no open/high/low/volume)."""
    return [c for c in ("open", "high", "low", "close", "volume") if not np.isfinite(getattr(p, c)).any()]


def available_features(p: Panel) -> tuple[list[str], dict[str, str]]:
    """(the features the panel's columns allow, {left-out feature: why})."""
    absent = set(absent_columns(p))
    left_out = {f: f"needs {', '.join(c for c in cols if c in absent)}, which the data lacks"
                for f, cols in FEATURE_INPUTS.items() if absent & set(cols)}
    return [f for f in FEATURES if f not in left_out], left_out


def causal_features(p: Panel, features: tuple[str, ...] | list[str] = FEATURES) -> np.ndarray:
    """[dates, tickers, len(features)] in the order given; row t depends on bars 0..t only."""
    unknown = [f for f in features if f not in FEATURE_INPUTS]
    if unknown:
        raise UsageError(f"unknown feature(s) {', '.join(unknown)}; choose from {', '.join(FEATURES)}")
    with np.errstate(divide="ignore", invalid="ignore"):
        log_close = np.log(p.close)
        ret_1d = np.vstack([np.full((1, p.shape[1]), np.nan), np.diff(log_close, axis=0)])

        def vol_20d():
            mean_r = _trailing_mean(ret_1d, LOOKBACK)
            return np.sqrt(np.maximum(_trailing_mean(ret_1d**2, LOOKBACK) - mean_r**2, 0.0))

        def volume_z():
            log_vol = np.log1p(p.volume)
            return log_vol - _trailing_mean(log_vol, LOOKBACK)

        compute = {"ret_1d": lambda: ret_1d, "range_hl": lambda: np.log(p.high / p.low),
                   "ret_oc": lambda: np.log(p.close / p.open), "volume_z": volume_z, "vol_20d": vol_20d}
        feats = np.stack([compute[f]() for f in features], axis=-1)
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


def plan_walk_forward(n_dates: int, window: int, horizon: int, val_frac: float, test_frac: float,
                      min_split_dates: int, folds: int) -> list[SplitPlan]:
    """`folds` expanding-window plans, oldest first. The last is exactly `plan_splits`'s plan; each
    earlier one is the same layout moved back by one test block, so the test blocks tile the end of
    the data without overlap, every fold's validation and test keep their sizes, and its training
    range starts at the first usable date and ends one embargo before its validation (it grows by
    one test block per fold). Embargoes as in `plan_splits`."""
    last = plan_splits(n_dates, window, horizon, val_frac, test_frac, min_split_dates)
    n_test = last.ranges["test"][1] - last.ranges["test"][0]
    plans = []
    for k in range(folds):
        shift = (folds - 1 - k) * n_test
        ranges = {s: (a - shift, b - shift) for s, (a, b) in last.ranges.items()}
        ranges["train"] = (last.first_anchor, ranges["train"][1])
        n_train = ranges["train"][1] - ranges["train"][0]
        if n_train < min_split_dates:
            raise UsageError(f"--walk-forward {folds}: the earliest fold would train on {n_train} anchor dates "
                             f"(need >= {min_split_dates}); use fewer folds, a smaller --test-frac or more history")
        plans.append(SplitPlan(ranges, last.embargo, last.first_anchor, ranges["test"][1] - 1))
    return plans


CLIP = 8.0  # normalised features are clipped to +-CLIP: fat tails must not blow up activations


def window_complete(ok_rows: np.ndarray, window: int) -> np.ndarray:
    """ok[t] = all of rows t-window+1..t are ok (False for t < window-1)."""
    bad = np.cumsum(~ok_rows, axis=0)
    out = np.zeros_like(ok_rows)
    prev = np.vstack([np.zeros((1, ok_rows.shape[1]), dtype=bad.dtype), bad[:-window]])
    out[window - 1:] = (bad[window - 1:] - prev) == 0
    return out
