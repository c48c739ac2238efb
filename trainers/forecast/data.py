"""The forecaster's data: market source -> panel -> causal features -> windows gathered by index.

A sample is (anchor date t, ticker n); its input is the normalised feature rows t-window+1..t of
ticker n and its label comes from the log return over the next `horizon` days: the return itself
(`raw`), the return minus the mean over that date's tickers (`demeaned`), or its rank among that
date's tickers scaled to [-1, 1] (`rank`, Qlib's usual label). Every tensor lives on the training
device and a batch is gathered by sample id, never built in Python.

The features are those the data's columns allow (a close-only file has no high/low/open/volume),
or the ones `--features` names; the list is fixed in config.json on the first run. With
`--universe sp500-pit` a (date, ticker) is a sample only while the ticker was in the index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from trainers.errors import UsageError
from trainers.forecast.config import ForecastConfig, named_features, refuse_legacy_resume
from trainers.forecast.metrics import MIN_NAMES
from trainers.market.panel import Panel, price_fingerprint, to_panel
from trainers.market.sources import DataRequest, fingerprinted, load_source, pinned_dates
from trainers.market.synthetic import synthetic_market
from trainers.market.universe import resolve_tickers
from trainers.market.windows import (
    CLIP,
    FEATURES,
    LOOKBACK,
    SPLITS,
    SplitPlan,
    available_features,
    causal_features,
    plan_splits,
    plan_walk_forward,
    window_complete,
)
from trainers.runtime import config as cfgmod

LABEL_TEXT = {"raw": "log(close[t+{h}] / close[t])",
              "demeaned": "log(close[t+{h}] / close[t]) minus its mean over the date's tickers",
              "rank": "rank of log(close[t+{h}] / close[t]) among the date's tickers, scaled to [-1, 1]"}


def data_request(cfg: ForecastConfig) -> DataRequest:
    tickers = None
    if cfg.universe == "sp500-pit" and (cfg.tickers is None and cfg.tickers_file is None) and cfg.source == "yfinance":
        from trainers.market.pit import load_history, members_between

        tickers = members_between(load_history(), cfg.start, cfg.end)  # who was in the index in these dates
        # (a file or the cache is read whole: load_market reports its symbols that were never members)
    elif cfg.tickers is not None or cfg.tickers_file is not None or cfg.source == "yfinance":
        # file and cache sources use every ticker they hold unless told otherwise
        tickers = resolve_tickers(cfg.tickers, cfg.tickers_file, cfg.universe)
    return DataRequest(source=cfg.source, tickers=tickers, cache_dir=cfg.cache_dir, start=cfg.start, end=cfg.end,
                       years=cfg.years, min_rows=cfg.min_history_days, synthetic_tickers=cfg.synthetic_tickers,
                       synthetic_days=cfg.synthetic_days, synthetic_seed=cfg.data_seed,
                       synthetic_momentum=cfg.synthetic_momentum)


def resolve(cfg: ForecastConfig, run_dir: Path, log=print) -> tuple[ForecastConfig, LoadedMarket]:
    """The run's options, settled once at its entry, and the market they select: a legacy folder refused, the dates
    and features pinned from the folder's saved config (else from today and from the data's columns), the saved
    run's options checked against them (a different config is refused); read-only from here (RunOptions.settled).
    A walk-forward job settles its own and hands each fold a settled copy: a fold is not settled again."""
    saved = cfgmod.saved_config(run_dir)
    refuse_legacy_resume(run_dir, saved)
    cfg = pin_dates(cfg, saved)
    cfgmod.check_run_dir_compatible(run_dir, cfg)
    market = load_market(cfg, log=log)
    return cfg.replaced(features=",".join(market.info["features"])).settled(), market


def pin_dates(cfg: ForecastConfig, saved: dict | None) -> ForecastConfig:
    """A copy with what a first run pins and a resume reads again from its `saved` config.json: real data's
    start/end (market.sources.pinned_dates: a resume next week reads the same dates) and the feature list left out
    (the first run's comes from the data's columns, `load_market`)."""
    features = saved.get("features") if saved is not None and cfg.features is None else cfg.features
    start, end = pinned_dates(DataRequest(source=cfg.source, start=cfg.start, end=cfg.end, years=cfg.years), saved)
    return cfg.replaced(start=start, end=end, features=features)


def cross_sectional(values: np.ndarray, valid: np.ndarray, kind: str) -> np.ndarray:
    """[dates, tickers] -> `kind` of each valid cell among the valid cells of its date (NaN elsewhere):
    raw, demeaned (minus the date's mean) or rank ((rank - 1) / (names - 1) * 2 - 1; ties averaged;
    0 for a date with one name)."""
    x = np.where(valid, values, np.nan)
    if kind == "raw":
        return x
    names = valid.sum(axis=1, keepdims=True)
    if kind == "demeaned":
        mean = np.where(valid, x, 0.0).sum(axis=1, keepdims=True) / np.maximum(names, 1)
        return x - mean
    if kind == "rank":
        ranks = pd.DataFrame(x).rank(axis=1).to_numpy()
        scaled = np.where(names > 1, 2.0 * (ranks - 1.0) / np.maximum(names - 1, 1) - 1.0, 0.0)
        return np.where(valid, scaled, np.nan)
    raise UsageError(f"--target {kind!r} is not one of: raw, demeaned, rank")


@dataclass
class MarketArrays:
    """Everything a split needs from the panel, computed once (walk-forward folds share it)."""

    features: np.ndarray  # [dates, tickers, F] causal features, not normalised (NaN: unknown)
    forward: np.ndarray  # [dates, tickers] log return over the next `horizon` days
    past: np.ndarray  # [dates, tickers] log return over the previous `horizon` days
    valid: np.ndarray  # [dates, tickers] a sample: complete window, both returns known, (a member)
    dates: list[str]
    tickers: list[str]
    feature_names: list[str]
    window: int
    horizon: int


def market_arrays(panel: Panel, window: int, horizon: int, features=FEATURES,
                  member: np.ndarray | None = None) -> MarketArrays:
    if window < 2:
        raise UsageError(f"--window {window} must be >= 2 days")
    if horizon <= 0:
        raise UsageError(f"--horizon {horizon} must be > 0 days")
    n_dates, n_tickers = panel.shape
    feats = causal_features(panel, list(features))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_close = np.log(panel.close)
    forward = np.full((n_dates, n_tickers), np.nan)
    past = np.full((n_dates, n_tickers), np.nan)
    if horizon < n_dates:
        forward[:-horizon] = log_close[horizon:] - log_close[:-horizon]
        past[horizon:] = log_close[horizon:] - log_close[:-horizon]
    row_ok = np.isfinite(feats).all(axis=-1)
    valid = window_complete(row_ok, window) & np.isfinite(forward) & np.isfinite(past)
    if member is not None:
        valid &= member
    return MarketArrays(feats, forward, past, valid, [d.strftime("%Y-%m-%d") for d in panel.dates],
                        list(panel.tickers), list(features), window, horizon)


@dataclass
class WindowStore:
    """All tensors on one device; a batch is gathered by sample id, never built in Python."""

    features: torch.Tensor  # [dates, tickers, F] normalised, NaN -> 0
    target: torch.Tensor  # [dates, tickers] the label the model trains on (NaN -> 0)
    sample_ids: dict[str, torch.Tensor]  # split -> flat ids (t * n_tickers + n), sorted
    forward_return: np.ndarray  # [dates, tickers] raw forward log return (evaluation, on the host)
    past_return: np.ndarray  # [dates, tickers] raw log return over the previous `horizon` days
    past_label: np.ndarray  # the past return turned into a label the same way (persistence)
    window: int
    horizon: int
    n_tickers: int
    dates: list[str]
    tickers: list[str]
    plan: SplitPlan
    feature_names: list[str]
    feature_mean: list[float]
    feature_std: list[float]
    target_kind: str
    target_mean: float
    target_std: float
    stats: dict = field(default_factory=dict)

    def to(self, device: torch.device) -> "WindowStore":
        self.features = self.features.to(device)
        self.target = self.target.to(device)
        self.sample_ids = {k: v.to(device) for k, v in self.sample_ids.items()}
        return self

    def gather(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs [B, window, F] and labels [B] for flat sample ids."""
        t = torch.div(ids, self.n_tickers, rounding_mode="floor")
        n = ids - t * self.n_tickers
        rows = t[:, None] + torch.arange(-self.window + 1, 1, device=ids.device)[None, :]
        return self.features[rows, n[:, None]], self.target[t, n]

    def date_index(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.div(ids, self.n_tickers, rounding_mode="floor")

    def preprocessing(self) -> dict:
        """What a consumer of the exported model needs to build its inputs and read its output."""
        return {"features": list(self.feature_names), "feature_mean": self.feature_mean,
                "feature_std": self.feature_std, "clip": CLIP, "window": self.window, "horizon": self.horizon,
                "lookback": LOOKBACK, "target": LABEL_TEXT[self.target_kind].format(h=self.horizon),
                "target_kind": self.target_kind, "target_mean": self.target_mean, "target_std": self.target_std}


def store_from(arrays: MarketArrays, plan: SplitPlan, target: str = "raw") -> WindowStore:
    """Normalise with the training period's statistics (rows up to the last train anchor), label,
    and list each split's samples."""
    feats = arrays.features
    n_features = feats.shape[-1]
    train_stop = plan.ranges["train"][1]
    train_rows = feats[:train_stop].reshape(-1, n_features)
    mean = np.nanmean(train_rows, axis=0)
    std = np.nanstd(train_rows, axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    norm = np.nan_to_num(np.clip((feats - mean) / std, -CLIP, CLIP), nan=0.0)

    label = cross_sectional(arrays.forward, arrays.valid, target)
    sample_ids = {}
    for split in SPLITS:
        start, stop = plan.ranges[split]
        mask = np.zeros_like(arrays.valid)
        mask[start:stop] = arrays.valid[start:stop]
        sample_ids[split] = torch.from_numpy(np.flatnonzero(mask.ravel()).astype(np.int64))
        if len(sample_ids[split]) == 0:
            raise UsageError(f"the {split} split has no complete sample (every window or target has gaps); "
                             f"check the data or use a shorter --window")
    train_labels = label.ravel()[sample_ids["train"].numpy()]
    return WindowStore(
        features=torch.from_numpy(norm.astype(np.float32)),
        target=torch.from_numpy(np.nan_to_num(label).astype(np.float32)),
        sample_ids=sample_ids, forward_return=arrays.forward, past_return=arrays.past,
        past_label=cross_sectional(arrays.past, arrays.valid, target),
        window=arrays.window, horizon=arrays.horizon, n_tickers=len(arrays.tickers), dates=arrays.dates,
        tickers=arrays.tickers, plan=plan, feature_names=arrays.feature_names, feature_mean=mean.tolist(),
        feature_std=std.tolist(), target_kind=target, target_mean=float(train_labels.mean()),
        target_std=float(train_labels.std() or 1.0), stats={s: int(len(v)) for s, v in sample_ids.items()},
    )


def build_store(panel: Panel, window: int, horizon: int, val_frac: float = 0.15, test_frac: float = 0.15,
                min_split_dates: int = 20, target: str = "raw", features=FEATURES) -> WindowStore:
    arrays = market_arrays(panel, window, horizon, features)
    plan = plan_splits(len(arrays.dates), window, horizon, val_frac, test_frac, min_split_dates)
    return store_from(arrays, plan, target)


@dataclass
class LoadedMarket:
    """What the source gave, turned into arrays, before any split (load once, split per fold)."""

    arrays: MarketArrays
    info: dict
    fingerprint: str | None = None  # what a run records of its data and checks on a resume or evaluation (data.json)


def only_tickers(panel: Panel, keep: np.ndarray) -> Panel:
    """The panel's columns `keep` (indices into panel.tickers)."""
    return Panel(panel.dates, [panel.tickers[i] for i in keep], panel.open[:, keep], panel.high[:, keep],
                 panel.low[:, keep], panel.close[:, keep], panel.volume[:, keep])


def universe_name(cfg: ForecastConfig) -> str:
    """Which universe really chose the tickers (a file or the cache is read whole unless told)."""
    if cfg.source == "synthetic":
        return "synthetic"
    if cfg.universe == "sp500-pit":
        return "sp500-pit"
    if cfg.tickers is not None or cfg.tickers_file is not None:
        return "--tickers" if cfg.tickers is not None else "--tickers-file"
    return cfg.universe if cfg.source == "yfinance" else "every ticker of the source"


def load_frame(cfg: ForecastConfig, log=print) -> tuple[pd.DataFrame, dict]:
    """The source's long table and what it says about itself. The shared market sources know only
    the synthetic effect's strength; the forecaster's `--synthetic-effect regime` builds its market
    here, from the same generator."""
    req = data_request(cfg)
    if cfg.source != "synthetic" or cfg.synthetic_effect == "momentum":
        return load_source(req, log=log)
    if req.tickers is not None:
        raise UsageError("--tickers/--tickers-file select real symbols; the synthetic market has its own "
                         "(use --synthetic-tickers N)")
    frame = synthetic_market(n_tickers=req.synthetic_tickers, n_days=req.synthetic_days, seed=req.synthetic_seed,
                             momentum=req.synthetic_momentum, effect=cfg.synthetic_effect)
    return frame, {"source": frame.attrs["source"], "synthetic": True,
                   "sources": {frame.attrs["source"]: req.synthetic_tickers}}


def load_market(cfg: ForecastConfig, log=print) -> LoadedMarket:
    """Load and validate the source, pick the features its columns allow (--features, else every one they allow:
    `info["features"]`, which a first run pins in its config), and apply the point-in-time universe."""
    frame, source_info = load_frame(cfg, log=log)
    panel = to_panel(frame)
    available, left_out = available_features(panel)
    names = named_features(cfg.features) if cfg.features is not None else list(available)
    lacking = [f for f in names if f in left_out]
    if lacking:
        raise UsageError(f"--features {cfg.features}: {', '.join(f'{f} {left_out[f]}' for f in lacking)}; "
                         f"this data allows {', '.join(available)}")
    member, universe = None, {"name": universe_name(cfg)}
    if cfg.universe == "sp500-pit":
        from trainers.market.pit import coverage, load_history, membership_mask

        history = load_history()
        member = membership_mask(history, panel.dates, panel.tickers)
        ever = member.any(axis=0)
        never = [s for s, e in zip(panel.tickers, ever) if not e]
        if never:  # none of their rows would be a sample: leave them out of the panel altogether
            panel = only_tickers(panel, np.flatnonzero(ever))
            member = member[:, ever]
        universe.update(coverage(history, panel.dates, panel.tickers, np.isfinite(panel.close)))
        universe["never_members"] = never
        log(f"universe sp500-pit: {universe['members']} members over these dates; prices for "
            f"{universe['covered_share']:.1%} of index-days ({len(universe['missing'])} members lacking, "
            f"{len(universe['partly_priced'])} partly priced)")
        if universe["never_members"]:
            log(f"warning: {len(universe['never_members'])} ticker(s) of the data were never in the index over "
                f"its dates, so none of their rows is used: {', '.join(universe['never_members'][:10])}")
    if len(panel.tickers) < MIN_NAMES:  # one ticker has no cross-section: a rank label is all zeros
        raise UsageError(f"the data holds {len(panel.tickers)} ticker(s) ({', '.join(panel.tickers)}); the forecaster "
                         f"ranks stocks against each other on each date and needs at least {MIN_NAMES}")
    # the bars every feature, label and baseline derives from (after the universe), as read; None where a fresh
    # machine reads other bars of the same market (market.sources.fingerprinted), and then not hashed at all (the
    # deploy's 25 years of the index are over 100 MB)
    fingerprint = price_fingerprint(panel.tickers, [d.isoformat() for d in panel.dates], panel.open, panel.high,
                                    panel.low, panel.close, panel.volume) if fingerprinted(source_info, cfg.source) \
        else None
    arrays = market_arrays(panel, cfg.window, cfg.horizon, names, member)
    info = {**source_info, "tickers": arrays.tickers, "n_tickers": len(arrays.tickers),
            "first_date": arrays.dates[0], "last_date": arrays.dates[-1], "n_dates": len(arrays.dates),
            "features": names, "features_left_out": left_out, "universe": universe, "target": cfg.target}
    return LoadedMarket(arrays, info, fingerprint)


def split_plan(cfg: ForecastConfig, n_dates: int) -> SplitPlan:
    """The plain chronological split, or fold `cfg.fold` of `--walk-forward K`."""
    if cfg.walk_forward:
        return plan_walk_forward(n_dates, cfg.window, cfg.horizon, cfg.val_frac, cfg.test_frac,
                                 cfg.min_split_dates, cfg.walk_forward)[cfg.fold or 0]
    return plan_splits(n_dates, cfg.window, cfg.horizon, cfg.val_frac, cfg.test_frac, cfg.min_split_dates)


def make_store(cfg: ForecastConfig, market: LoadedMarket) -> tuple[WindowStore, dict]:
    plan = split_plan(cfg, len(market.arrays.dates))
    store = store_from(market.arrays, plan, cfg.target)
    data_info = {**market.info, "embargo_dates": plan.embargo, "samples": store.stats,
                 "anchor_dates": {s: [store.dates[a], store.dates[b - 1]] for s, (a, b) in plan.ranges.items()}}
    if cfg.walk_forward:
        data_info["walk_forward"] = {"folds": cfg.walk_forward, "fold": cfg.fold}
    return store, data_info


def load_store(cfg: ForecastConfig, log=print) -> tuple[WindowStore, dict]:
    return make_store(cfg, load_market(cfg, log))
