"""A job: its symbols, their bars and timeframes, each symbol's run folder and config.

    <job>/config.json                 the job's config (a different one is refused)
    <job>/training.log                one line per claim, resume, result, retry and failure, every worker
    <job>/results.json, results.md    the summary of all symbols (trainers.lstm.summary)
    <job>/symbols/<SYMBOL>/           a complete run folder per symbol (config.json, training.log,
                                      metrics.jsonl, checkpoints/, results.json, model.onnx,
                                      export.json) and done.json once it finished (trainers.lstm.queue)

`prepare_job` checks every symbol before anything is written: the name, the bars, the timeframes
against the bar interval, and enough history for the window, horizon and splits. With
`--universe sp500-pit` it keeps each symbol's samples to the dates it was in the index
(`point_in_time`); there, a member with too little history as a member is left out and reported
instead of refusing the job, unless the user named it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from trainers.errors import UsageError
from trainers.lstm.bars import Bars, load_bars, named_symbols, only_bars
from trainers.lstm.config import LstmConfig, Timeframe, resolve_timeframes
from trainers.lstm.features import build_symbol_data, higher_history_bars
from trainers.market.pit import load_history, members_between, membership_mask
from trainers.market.windows import LOOKBACK
from trainers.runtime import config as cfgmod
from trainers.runtime.sampling import EpochPlan


@dataclass
class JobPlan:
    symbols: list[str]
    bars: dict[str, Bars]
    timeframes: list[Timeframe]
    total_steps: dict[str, int]  # per symbol, planned
    source: dict


def symbol_dir(job_dir: Path, symbol: str) -> Path:
    return Path(job_dir) / "symbols" / symbol


def symbol_seed(seed: int, symbol: str) -> int:
    """A distinct, stable seed per symbol (the same whichever worker trains it)."""
    return seed + zlib.crc32(symbol.encode()) % 1_000_000


# A symbol's run waits this long at its end for its mirror (the job's own end waits --remote-wait-s): a store
# that is down must not hold every symbol of the job for the whole wait.
SYMBOL_REMOTE_WAIT_S = 30.0


def symbol_config(cfg: LstmConfig, symbol: str) -> LstmConfig:
    """The config of one symbol's run: its own folder and seed; the job's budget is enforced by the job."""
    remote = None if cfg.remote is None else f"{cfg.remote.rstrip('/')}/symbols/{symbol}"  # the job's layout
    return cfg.replaced(run_dir=str(symbol_dir(Path(cfg.run_dir), symbol)), symbols=symbol, tickers_file=None,
                        seed=symbol_seed(cfg.seed, symbol), max_hours=None, budget_usd=None, remote=remote,
                        remote_wait_s=min(cfg.remote_wait_s, SYMBOL_REMOTE_WAIT_S))


def planned_steps(cfg: LstmConfig, n_train: int) -> int:
    steps = cfg.epochs * EpochPlan(n_train, 1, 0, cfg.batch_size, cfg.seed, 0).steps
    return min(steps, cfg.max_steps) if cfg.max_steps is not None else steps


def resolve(cfg: LstmConfig, run_dir: Path) -> LstmConfig:
    """The job's options, settled once at its entry: the dates pinned (from the job folder's saved config, else
    from today), the saved job's options checked against them (a different config is refused); read-only from
    here (RunOptions.settled), each symbol's config a settled copy (symbol_config)."""
    cfg = pin_dates(cfg, cfgmod.saved_config(run_dir))  # (a copy: the caller's object stays its own)
    cfgmod.check_run_dir_compatible(run_dir, cfg)
    return cfg.settled()


def pin_dates(cfg: LstmConfig, saved: dict | None) -> LstmConfig:
    """Real daily data: start/end pinned on the first run so a resume next week reads the same bars. A copy, always
    (synthetic bars and files, whose dates do not move, keep theirs)."""
    if cfg.source in ("synthetic",) or cfg.source.startswith("file:"):
        return cfg.replaced()
    from trainers.market.sources import DataRequest

    if saved is not None:
        return cfg.replaced(start=cfg.start or saved.get("start"), end=cfg.end or saved.get("end"))
    start, end = DataRequest(start=cfg.start, end=cfg.end, years=cfg.years).date_range()
    return cfg.replaced(start=start, end=end)


def point_in_time(bars: dict[str, Bars], cfg: LstmConfig, timeframes: list[Timeframe], log=print
                  ) -> tuple[dict[str, Bars], dict]:
    """`--universe sp500-pit` (trainers.market.pit): a symbol's samples only on dates it was in the
    index. Each symbol's bars are cut to its membership span, keeping before it the history its first
    anchor's features read (so the first sample is the day it joined) and after it the horizon (the
    last sample is its last day in); anchors in a gap (it left and came back) are masked
    (`Bars.member`). Symbols never in the index over their bars are left out, and reported."""
    history = load_history()
    reach = cfg.window - 1 + LOOKBACK + higher_history_bars(timeframes)  # bars before an anchor its inputs read
    out, never = {}, []
    for s, b in bars.items():
        member = membership_mask(history, pd.DatetimeIndex(b.ts).normalize(), [s])[:, 0]
        if not member.any():
            never.append(s)
            continue
        inside = np.flatnonzero(member)
        lo, hi = max(0, int(inside[0]) - reach), min(len(b), int(inside[-1]) + 1 + cfg.horizon)
        out[s] = only_bars(b, lo, hi, member[lo:hi])
    first = min(pd.Timestamp(b.ts[0]) for b in bars.values())
    last = max(pd.Timestamp(b.ts[-1]) for b in bars.values())
    members = members_between(history, f"{first:%Y-%m-%d}", f"{last + pd.Timedelta(days=1):%Y-%m-%d}")
    if never:
        log(f"warning: {len(never)} symbol(s) of the data were never in the S&P 500 over their bars, left out: "
            f"{', '.join(never[:10])}{' ...' if len(never) > 10 else ''}")
    if not out:
        raise UsageError(f"--universe sp500-pit: none of the {len(bars)} symbol(s) of --source {cfg.source} was in "
                         f"the S&P 500 over its bars ({', '.join(never[:10])}); use --universe sp500 for them")
    universe = {"name": "sp500-pit", "members_over_the_dates": len(members), "never_members": never,
                "members_without_bars": sorted(set(members) - set(bars)),
                "member_bars": {s: int(b.member.sum()) for s, b in out.items()}}
    return out, universe


def prepare_job(cfg: LstmConfig, log=print) -> JobPlan:
    bars, source = load_bars(cfg, log)
    timeframes = resolve_timeframes(cfg.timeframes, next(iter(bars.values())).base)
    universe = None
    if cfg.universe == "sp500-pit":
        bars, universe = point_in_time(bars, cfg, timeframes, log)
    symbols = list(bars)
    total, left_out, unusable = {}, {}, {}
    for s in symbols:  # every check a symbol can fail, now; the tensors are rebuilt when it is trained
        try:
            data = build_symbol_data(bars[s], symbol_config(cfg, s), timeframes)
        except UsageError as exc:
            if universe is None or named_symbols(cfg):  # a symbol the user named must train
                raise
            unusable[s] = str(exc)  # a member too briefly (or with too few member bars) to split
            continue
        total[s] = planned_steps(cfg, len(data.ids["train"]))
        if data.features_left_out:
            left_out[s] = data.features_left_out
    if unusable:
        log(f"warning: {len(unusable)} member(s) left out, too little history as members: "
            f"{', '.join(list(unusable)[:10])}{' ...' if len(unusable) > 10 else ''}")
        symbols = [s for s in symbols if s not in unusable]
        bars = {s: bars[s] for s in symbols}
        universe["too_little_history"] = unusable
        if not symbols:
            raise UsageError(f"--universe sp500-pit: no member has enough history as a member to train on (e.g. "
                             f"{next(iter(unusable.values()))})")
    by_columns: dict[tuple, list[str]] = {}
    for s in left_out:  # one line per set of missing columns, not per symbol
        by_columns.setdefault((tuple(bars[s].absent_columns()), tuple(left_out[s])), []).append(s)
    for (columns, names), which in by_columns.items():
        log(f"{', '.join(which[:10])}{' ...' if len(which) > 10 else ''}: the data lacks {', '.join(columns)}; "
            f"features left out: {', '.join(names)}")
    source = dict(source, base_timeframe=timeframes[0].label, timeframes=[t.label for t in timeframes],
                  symbols=symbols, calendars={s: bars[s].calendar for s in symbols}, features_left_out=left_out)
    if universe is not None:
        source["universe"] = universe
    return JobPlan(symbols, bars, timeframes, total, source)
