"""Multi-timeframe features that are causal by construction, direction labels, splits, normalisation.

Base bar i opens at ts[i] and closes at ts[i] + base. Every feature at bar i is known at that close:

- the base bars' own features (trainers.market.windows.causal_features: return, high-low range,
  open-to-close return, volume against its 20-bar mean, 20-bar volatility);
- for each higher timeframe (1w, 1M over daily bars; 4h, 1d over hourly ones), three features of
  the last higher bar that has CLOSED: its return over the one before, its high-low range, and the
  current base close against its close.

A feature that needs a column the symbol's data lacks (a close-only file has no open, high, low or
volume: the ranges, the open-to-close return and the volume score) is left out, not filled with
made-up values, as the forecaster does (trainers.market.windows.available_features); the names and
reasons go into the symbol's results.json (`data.features_left_out`) and the job's summary, and the
model's input size is the number of features kept. A higher bar is the period [start, end) (4h buckets from
  midnight, days, Monday-to-Sunday weeks, calendar months) and aggregates the base bars that open
  inside it. It closes at bar i when end <= e[i], the earliest time the next bar can open: ts[i] +
  base, or for daily bars on a weekday calendar the next weekday's midnight (a stock's week closes
  with Friday's bar, a crypto week with Sunday's). Every bar of a closed period opens before e[i],
  and no bar after i opens before e[i] (bars are at least `base` apart, weekday symbols have no
  weekend bars), so a closed period holds bars 0..i only. The seed's code joined higher bars by
  their open time, which shows a 4h bar at its first hour: up to three hours of the future.

Target: the direction of log(close[i+h] / close[i]), 1 up, 0 down; |return| <= dead zone gets no
label. The input window is bars i-window+1..i, so the target never overlaps the inputs. Anchors are
split by time (trainers.market.windows.plan_splits) with an embargo that covers the window, the
horizon, the base features' look-back and three periods of the longest higher timeframe, so no
input bar or target bar of one split is an input or target bar of another. Normalisation
statistics come from the bars up to the last training anchor only. With `--universe sp500-pit` an
anchor (a sample, and a bar the strategy trades) must also be a date the symbol was in the index
(`Bars.member`; its inputs may reach back before it joined: prices known at the time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from trainers.errors import UsageError
from trainers.lstm.bars import SEVEN_DAYS, Bars
from trainers.lstm.config import LstmConfig, Timeframe
from trainers.market.panel import Panel
from trainers.market.windows import (
    CLIP,
    LOOKBACK,
    SPLITS,
    SplitPlan,
    absent_columns,
    available_features,
    causal_features,
    plan_splits,
    window_complete,
)

# causal_features' names -> the LSTM's (what its exported preprocessing has always called them)
BASE_FEATURES = {"ret_1d": "ret", "range_hl": "range_hl", "ret_oc": "ret_oc", "volume_z": "volume_z",
                 "vol_20d": "vol_20"}
HIGHER_FEATURES = {"ret": ("close",), "range_hl": ("high", "low"), "gap": ("close",)}  # and the columns each needs
NS_PER_MIN = 60 * 10**9


def _days(ts: np.ndarray) -> np.ndarray:
    return ts.astype("datetime64[D]")


def _weekday(days: np.ndarray) -> np.ndarray:
    """Monday 0 .. Sunday 6 (1970-01-01 was a Thursday)."""
    return (days.astype(np.int64) + 3) % 7


def earliest_next_open(ts: np.ndarray, base: Timeframe, calendar: str) -> np.ndarray:
    """e[i]: the earliest time a bar after bar i can open (see the module docstring)."""
    if base.unit != "d":
        return ts + np.timedelta64(base.minutes, "m")
    nxt = _days(ts) + 1
    if calendar != SEVEN_DAYS:  # no bar on Saturday or Sunday: the next one opens on Monday at the earliest
        wd = _weekday(nxt)
        nxt = nxt + np.where(wd == 5, 2, np.where(wd == 6, 1, 0))
    return nxt.astype("datetime64[ns]")


def period_bounds(ts: np.ndarray, tf: Timeframe) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of the `tf` period each timestamp falls in."""
    if tf.unit == "M":
        start = ts.astype("datetime64[M]")
        return start.astype("datetime64[ns]"), (start + 1).astype("datetime64[ns]")
    if tf.unit == "w":
        days = _days(ts)
        start = days - _weekday(days)
        return start.astype("datetime64[ns]"), (start + 7).astype("datetime64[ns]")
    length = tf.minutes * NS_PER_MIN  # divides a day, so periods start at midnight
    t = ts.astype(np.int64)
    start = t - t % length
    return start.astype("datetime64[ns]"), (start + length).astype("datetime64[ns]")


def higher_timeframe_features(bars: Bars, tf: Timeframe) -> np.ndarray:
    """[bars, 3]: return, range and gap of the last `tf` bar closed at each base bar (NaN before two
    have closed)."""
    start, end = period_bounds(bars.ts, tf)
    first = np.flatnonzero(np.r_[True, start[1:] != start[:-1]])  # bars are sorted: periods are runs
    last = np.r_[first[1:] - 1, len(bars) - 1]
    high = np.maximum.reduceat(bars.high, first)
    low = np.minimum.reduceat(bars.low, first)
    close = bars.close[last]
    closed = np.searchsorted(end[first], earliest_next_open(bars.ts, bars.base, bars.calendar), side="right") - 1
    out = np.full((len(bars), 3), np.nan)
    ok = closed >= 1
    q = closed[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        out[ok, 0] = np.log(close[q] / close[q - 1])
        out[ok, 1] = np.log(high[q] / low[q])
        out[ok, 2] = np.log(bars.close[ok] / close[q])
    return out


def raw_features(bars: Bars, timeframes: list[Timeframe]) -> tuple[np.ndarray, list[str], dict[str, str]]:
    """[bars, F] unnormalised features (NaN where not yet defined), their names, and {feature left
    out: why} for those that need a column this symbol's bars lack."""
    panel = Panel(bars.ts, [bars.symbol], bars.open[:, None], bars.high[:, None], bars.low[:, None],
                  bars.close[:, None], bars.volume[:, None])
    base = timeframes[0].label
    kept, why = available_features(panel)
    parts = [causal_features(panel, kept)[:, 0, :]]
    names = [f"{base}:{BASE_FEATURES[f]}" for f in kept]
    left_out = {f"{base}:{BASE_FEATURES[f]}": reason for f, reason in why.items()}
    absent = set(absent_columns(panel))
    for tf in timeframes[1:]:
        higher = higher_timeframe_features(bars, tf)
        for j, (name, needs) in enumerate(HIGHER_FEATURES.items()):
            lacking = [c for c in needs if c in absent]
            if lacking:
                left_out[f"{tf.label}:{name}"] = f"needs {', '.join(lacking)}, which the data lacks"
            else:
                parts.append(higher[:, j:j + 1])
                names.append(f"{tf.label}:{name}")
    feats = np.concatenate(parts, axis=1)
    feats[~np.isfinite(feats)] = np.nan
    assert feats.shape[1] == len(names)
    return feats, names, left_out


def higher_history_bars(timeframes: list[Timeframe]) -> int:
    """Base bars the higher-timeframe features can reach back: three of the longest periods (the last
    closed one, the one before it, and the current unfinished one)."""
    base = timeframes[0].minutes
    longest = max((tf.nominal_minutes for tf in timeframes[1:]), default=0)
    return math.ceil(3 * longest / base)


def direction_target(close: np.ndarray, horizon: int, dead_zone: float) -> tuple[np.ndarray, np.ndarray]:
    """(log return over the next `horizon` bars, label: 1 up, 0 down, NaN in the dead zone or at the end)."""
    ret = np.full(len(close), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        ret[:-horizon] = np.log(close[horizon:] / close[:-horizon])
    label = np.where(ret > dead_zone, 1.0, np.where(ret < -dead_zone, 0.0, np.nan))
    label[~np.isfinite(ret)] = np.nan
    return ret, label


def plan_symbol_splits(symbol: str, n_bars: int, cfg: LstmConfig, timeframes: list[Timeframe]) -> SplitPlan:
    span = cfg.window + higher_history_bars(timeframes)

    def plan(n: int) -> SplitPlan:
        return plan_splits(n, span, cfg.horizon, cfg.val_frac, cfg.test_frac, cfg.min_split_bars)

    try:
        return plan(n_bars)
    except UsageError:
        need = n_bars + 1
        while True:  # the least history that works (plan_splits is arithmetic: this is instant)
            try:
                plan(need)
                break
            except UsageError:
                need = need * 2 if need < 10**7 else need + 10**7
        low, high = n_bars + 1, need
        while low < high:
            mid = (low + high) // 2
            try:
                plan(mid)
                high = mid
            except UsageError:
                low = mid + 1
        base = timeframes[0].label
        raise UsageError(f"{symbol}: too little history: {n_bars} {base} bars cannot hold train/val/test of >= "
                         f"{cfg.min_split_bars} anchors each with --window {cfg.window} (+{span - cfg.window} bars "
                         f"of {timeframes[-1].label} history), --horizon {cfg.horizon} and two embargoes; need "
                         f"{low} bars (more history, a shorter --window or --horizon, fewer --timeframes, or a "
                         f"lower --min-split-bars)") from None


@dataclass
class SymbolData:
    """One symbol's tensors (on one device) and what a consumer of its model must know."""

    symbol: str
    ts: np.ndarray
    features: torch.Tensor  # [bars, F] normalised and clipped, NaN -> 0
    label: torch.Tensor  # [bars] 1 up / 0 down / NaN no label
    ret_h: np.ndarray  # [bars] log return over the horizon
    ret_1: np.ndarray  # [bars] log return of the next bar (what a position held for one bar earns)
    past_ret: np.ndarray  # [bars] log return over the previous `horizon` bars (the persistence baseline)
    ids: dict[str, torch.Tensor]  # split -> labelled anchors with a complete window (train, val loss, metrics)
    trade_ids: dict[str, np.ndarray]  # split -> every anchor with a complete window (the strategy)
    window: int
    horizon: int
    plan: SplitPlan
    feature_names: list[str]
    features_left_out: dict[str, str]  # feature -> why (a column the data lacks)
    member_bars: int | None  # --universe sp500-pit: bars at which the symbol was in the index
    feature_mean: list[float]
    feature_std: list[float]
    timeframes: list[Timeframe]
    calendar: str
    pos_weight: float  # n_down / n_up of the training split (1.0 when class weights are off)
    train_up_rate: float

    @property
    def n_features(self) -> int:
        return self.features.shape[1]

    def to(self, device: torch.device) -> "SymbolData":
        self.features = self.features.to(device)
        self.label = self.label.to(device)
        self.ids = {k: v.to(device) for k, v in self.ids.items()}
        return self

    def gather(self, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows [B, window, F] ending at `anchors`, and their labels [B]."""
        rows = anchors[:, None] + torch.arange(-self.window + 1, 1, device=anchors.device)[None, :]
        return self.features[rows], self.label[anchors]

    def info(self) -> dict:
        stamp = lambda i: str(np.datetime_as_string(self.ts[i], unit="m"))  # noqa: E731
        labelled = {s: v.cpu().numpy() for s, v in self.ids.items()}
        label = self.label.cpu().numpy()
        return {"symbol": self.symbol, "bars": int(len(self.ts)), "first_bar": stamp(0), "last_bar": stamp(-1),
                "base_timeframe": self.timeframes[0].label, "timeframes": [t.label for t in self.timeframes],
                "calendar": self.calendar, "features": self.feature_names,
                "features_left_out": self.features_left_out, "window": self.window,
                "member_bars": self.member_bars,
                "horizon": self.horizon, "embargo_bars": self.plan.embargo,
                "anchors": {s: [stamp(a), stamp(b - 1)] for s, (a, b) in self.plan.ranges.items()},
                "samples": {s: int(len(v)) for s, v in labelled.items()},
                "up_rate": {s: float(label[v].mean()) for s, v in labelled.items()},
                "pos_weight": self.pos_weight}

    def preprocessing(self) -> dict:
        """What a consumer of the exported model needs to build its input."""
        return {"features": self.feature_names, "feature_mean": self.feature_mean, "feature_std": self.feature_std,
                "clip": CLIP, "window": self.window, "timeframes": [t.label for t in self.timeframes],
                "calendar": self.calendar, "base_lookback_bars": LOOKBACK,
                "input": "normalise (x - mean) / std, clip to +-clip, NaN -> 0; rows are the window's base bars, "
                         "oldest first, the last one the bar just closed",
                "output": f"probability that close rises over the next {self.horizon} base bar(s)"}


def build_symbol_data(bars: Bars, cfg: LstmConfig, timeframes: list[Timeframe]) -> SymbolData:
    n = len(bars)
    plan = plan_symbol_splits(bars.symbol, n, cfg, timeframes)
    feats, names, left_out = raw_features(bars, timeframes)
    ret_h, label = direction_target(bars.close, cfg.horizon, cfg.dead_zone)
    ret_1, _ = direction_target(bars.close, 1, 0.0)
    past_ret = np.full(n, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        past_ret[cfg.horizon:] = np.log(bars.close[cfg.horizon:] / bars.close[:-cfg.horizon])
    complete = window_complete(np.isfinite(feats).all(axis=1)[:, None], cfg.window)[:, 0]
    if bars.member is not None:  # --universe sp500-pit: an anchor only where the symbol was in the index
        complete &= bars.member

    _, train_stop = plan.ranges["train"]
    mean = np.nanmean(feats[:train_stop], axis=0)  # the training period only
    std = np.nanstd(feats[:train_stop], axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    norm = np.nan_to_num(np.clip((feats - mean) / std, -CLIP, CLIP), nan=0.0)

    ids, trade_ids = {}, {}
    for split in SPLITS:
        a, b = plan.ranges[split]
        in_split = np.zeros(n, dtype=bool)
        in_split[a:b] = True
        ids[split] = np.flatnonzero(in_split & complete & np.isfinite(label))
        trade_ids[split] = np.flatnonzero(in_split & complete & np.isfinite(ret_1))
        if len(ids[split]) == 0:
            raise UsageError(f"{bars.symbol}: the {split} split has no labelled window (gaps in the bars, or "
                             f"--dead-zone {cfg.dead_zone} leaves no return outside it)")
    train_labels = label[ids["train"]]
    n_up = int(train_labels.sum())
    n_down = len(train_labels) - n_up
    if n_up == 0 or n_down == 0:
        raise UsageError(f"{bars.symbol}: the training split has only {'up' if n_down == 0 else 'down'} labels; "
                         f"a direction model needs both (lower --dead-zone or use more history)")
    return SymbolData(
        symbol=bars.symbol, ts=bars.ts, features=torch.from_numpy(norm.astype(np.float32)),
        label=torch.from_numpy(label.astype(np.float32)), ret_h=ret_h, ret_1=ret_1, past_ret=past_ret,
        ids={k: torch.from_numpy(v.astype(np.int64)) for k, v in ids.items()}, trade_ids=trade_ids,
        window=cfg.window, horizon=cfg.horizon, plan=plan, feature_names=names, features_left_out=left_out,
        member_bars=None if bars.member is None else int(bars.member.sum()),
        feature_mean=mean.tolist(),
        feature_std=std.tolist(), timeframes=timeframes, calendar=bars.calendar,
        pos_weight=n_down / n_up if cfg.class_weights else 1.0, train_up_rate=n_up / len(train_labels))
