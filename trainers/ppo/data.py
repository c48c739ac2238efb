"""The agent's market from any source of the market package (synthetic, yfinance cache, user files)."""

from __future__ import annotations

from pathlib import Path

from trainers.market.panel import to_panel
from trainers.market.sources import DataRequest, load_source, pinned_dates
from trainers.market.sources import checked_fingerprint as market_checked_fingerprint
from trainers.market.universe import resolve_tickers
from trainers.ppo.config import PpoConfig
from trainers.ppo.env import EnvSpec
from trainers.ppo.features import TradingData, build_trading_data


def data_request(cfg: PpoConfig) -> DataRequest:
    tickers = None
    if cfg.source == "yfinance" or cfg.tickers is not None or cfg.tickers_file is not None:
        tickers = resolve_tickers(cfg.tickers, cfg.tickers_file, cfg.universe)
    return DataRequest(source=cfg.source, tickers=tickers, cache_dir=cfg.cache_dir, start=cfg.start, end=cfg.end,
                       years=cfg.years, min_rows=cfg.min_history_days, synthetic_tickers=cfg.synthetic_tickers,
                       synthetic_days=cfg.synthetic_days, synthetic_seed=cfg.data_seed,
                       synthetic_momentum=cfg.synthetic_momentum)


def pin_dates(cfg: PpoConfig, saved: dict | None) -> PpoConfig:
    """A copy with real data's start/end pinned as a first run pins them, or as its `saved` config.json did (a resume
    next week reads the same dates; a file's --years count back from its last date: market.sources.pinned_dates)."""
    start, end = pinned_dates(DataRequest(source=cfg.source, start=cfg.start, end=cfg.end, years=cfg.years), saved)
    return cfg.replaced(start=start, end=end)


def load_trading_data(cfg: PpoConfig, log=print) -> tuple[TradingData, dict]:
    frame, source_info = load_source(data_request(cfg), log=log)
    dropped = (source_info.get("validation") or {}).get("dropped_by_ticker", {})
    data, pick_info = build_trading_data(to_panel(frame), cfg.num_stocks, cfg.window, cfg.val_frac, cfg.test_frac,
                                         cfg.min_split_dates, dropped)
    if pick_info["high_low_from_close"]:
        log(f"data: {len(pick_info['high_low_from_close'])} stock(s) traded have closes only (no high/low): their CCI "
            f"and ADX are computed from closes")
    traded = {t: dropped[t] for t in data.tickers if t in dropped}  # the portfolio's own: data.json and the log
    if traded:
        filled = pick_info["bars_filled"]
        log("data: bad rows dropped, per stock traded (filled from its last close): " +
            "; ".join(f"{t} {sum(c.values())} ({filled.get(t, 0)} filled)" for t, c in traded.items()))
    return data, {**source_info, **pick_info, "rows_dropped_by_stock": traded, **data.describe()}


def load_checked_data(cfg: PpoConfig, run_dir: Path, instead: str) -> tuple[TradingData, dict]:
    """A trained run's data read again for a command after its training (evaluate, export), checked against the
    run's record (a run of an older kit has none: nothing to check it against). `instead`: what the command needs
    it for, said when the data changed."""
    from trainers.runtime.rundir import check_data_unchanged, fingerprint_to_check

    data, info = load_trading_data(cfg, log=lambda _m: None)
    check_data_unchanged(run_dir, fingerprint_to_check(run_dir, checked_fingerprint(data, info, cfg.source)),
                         instead=instead)
    return data, info


def checked_fingerprint(data: TradingData, info: dict, source: str) -> str | None:
    """What the run records and checks of its data (market.sources.checked_fingerprint: none for the synthetic
    market, yfinance and a cache Yahoo alone filled)."""
    return market_checked_fingerprint(data.fingerprint, info, source)


def env_spec(cfg: PpoConfig) -> EnvSpec:
    spec = EnvSpec(window=cfg.window, episode_days=cfg.episode_days, action=cfg.action, h_max=cfg.h_max,
                   initial_cash=cfg.initial_cash, cost_bps=cfg.cost_bps, reward=cfg.reward,
                   reward_scale=cfg.reward_scale)
    spec.check()
    return spec
