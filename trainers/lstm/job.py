"""A job: its symbols, their bars and timeframes, each symbol's run folder and config.

    <job>/config.json                 the job's config (a different one is refused)
    <job>/training.log                one line per claim, resume, result, retry and failure, every worker
    <job>/results.json, results.md    the summary of all symbols (trainers.lstm.summary)
    <job>/symbols/<SYMBOL>/           a complete run folder per symbol (config.json, training.log,
                                      metrics.jsonl, checkpoints/, results.json, model.onnx,
                                      export.json) and done.json once it finished (trainers.lstm.queue)

`prepare_job` checks every symbol before anything is written: the name, the bars, the timeframes
against the bar interval, and enough history for the window, horizon and splits.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from pathlib import Path

from trainers.lstm.bars import Bars, load_bars
from trainers.lstm.config import LstmConfig, Timeframe, resolve_timeframes
from trainers.lstm.features import build_symbol_data
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


def symbol_config(cfg: LstmConfig, symbol: str) -> LstmConfig:
    """The config of one symbol's run: its own folder and seed; the job's budget is enforced by the job."""
    return dataclasses.replace(cfg, run_dir=str(symbol_dir(Path(cfg.run_dir), symbol)), symbols=symbol,
                               tickers_file=None, seed=symbol_seed(cfg.seed, symbol), max_hours=None,
                               budget_usd=None)


def planned_steps(cfg: LstmConfig, n_train: int) -> int:
    steps = cfg.epochs * EpochPlan(n_train, 1, 0, cfg.batch_size, cfg.seed, 0).steps
    return min(steps, cfg.max_steps) if cfg.max_steps is not None else steps


def fix_date_range(cfg: LstmConfig, saved: dict | None) -> None:
    """Real daily data: pin start/end on the first run so a resume next week reads the same bars."""
    if cfg.source in ("synthetic",) or cfg.source.startswith("file:"):
        return
    from trainers.market.sources import DataRequest

    if saved is not None:
        cfg.start = cfg.start or saved.get("start")
        cfg.end = cfg.end or saved.get("end")
    else:
        cfg.start, cfg.end = DataRequest(start=cfg.start, end=cfg.end, years=cfg.years).date_range()


def prepare_job(cfg: LstmConfig, log=print) -> JobPlan:
    bars, source = load_bars(cfg, log)
    symbols = list(bars)
    timeframes = resolve_timeframes(cfg.timeframes, bars[symbols[0]].base)
    total, left_out = {}, {}
    for s in symbols:  # every check a symbol can fail, now; the tensors are rebuilt when it is trained
        data = build_symbol_data(bars[s], symbol_config(cfg, s), timeframes)
        total[s] = planned_steps(cfg, len(data.ids["train"]))
        if data.features_left_out:
            left_out[s] = data.features_left_out
    by_columns: dict[tuple, list[str]] = {}
    for s in left_out:  # one line per set of missing columns, not per symbol
        by_columns.setdefault((tuple(bars[s].absent_columns()), tuple(left_out[s])), []).append(s)
    for (columns, names), which in by_columns.items():
        log(f"{', '.join(which[:10])}{' ...' if len(which) > 10 else ''}: the data lacks {', '.join(columns)}; "
            f"features left out: {', '.join(names)}")
    source = dict(source, base_timeframe=timeframes[0].label, timeframes=[t.label for t in timeframes],
                  symbols=symbols, calendars={s: bars[s].calendar for s in symbols}, features_left_out=left_out)
    return JobPlan(symbols, bars, timeframes, total, source)
