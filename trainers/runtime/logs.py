"""Rank-0 logging: console + training.log, metrics.jsonl + TensorBoard, a tqdm bar.

Other ranks get a logger that only prints warnings and errors (tagged with the rank), a metrics
writer that does nothing and a disabled progress bar, so trainer code never branches on rank.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm


def get_logger(rank: int, run_dir: Path | None, name: str = "trainers") -> logging.Logger:
    """A logger per run folder: an LSTM cohort opens K runs in one process, and one logger shared by them
    once sent every member's lines to the last member's training.log."""
    logger = logging.getLogger(logger_name(rank, run_dir, name))
    close_handlers(logger)
    logger.propagate = False
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    console = BarAwareHandler(sys.stderr)
    console.setFormatter(logging.Formatter(f"%(asctime)s [rank{rank}] %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(console)
    if rank == 0:
        logger.setLevel(logging.INFO)
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            fh = logging.FileHandler(run_dir / "training.log")
            fh.setFormatter(fmt)
            logger.addHandler(fh)
    else:
        logger.setLevel(logging.WARNING)
    return logger


class BarAwareHandler(logging.StreamHandler):
    """The console: a line logged while the progress bar is drawn gets a line of its own, where it was glued onto the
    bar (`loss=0.9769]21:41:17 [rank0] INFO`, issue 66). On a terminal tqdm.write lifts the bar, prints and draws it
    again. On a pipe (the deploy's tee into its log) a carriage return does not start a line, so the line is
    preceded by a newline whenever a bar drew since the last line logged."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._last_line_t = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            tty = getattr(self.stream, "isatty", lambda: False)()
            if tty:
                tqdm.write(line, file=self.stream)
            else:
                with tqdm.get_lock():
                    drew = any(not bar.disable and getattr(bar, "last_print_t", 0.0) > self._last_line_t
                               for bar in list(getattr(tqdm, "_instances", ())))
                    self.stream.write(("\n" if drew else "") + line + "\n")
                    self.flush()
            self._last_line_t = time.time()
        except Exception:  # logging's own contract: a handler that fails reports and never raises into the loop
            self.handleError(record)


def logger_name(rank: int, run_dir: Path | None, name: str = "trainers") -> str:
    return f"{name}.rank{rank}" if run_dir is None else f"{name}.rank{rank}:{Path(run_dir).absolute()}"


def close_handlers(logger: logging.Logger) -> None:
    """Its files closed and its handlers gone (a job of 500 symbols must not keep 500 logs open)."""
    for handler in list(logger.handlers):
        handler.close()
        logger.removeHandler(handler)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null is honest
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return value


class MetricsWriter:
    """One JSON object per logged step in metrics.jsonl, and the same scalars in TensorBoard."""

    def __init__(self, run_dir: Path | None, enabled: bool):
        self.enabled = enabled and run_dir is not None
        self.disk_full: OSError | None = None  # a write found the volume full: writing stopped, the run stops
        self._file = None
        self._tb = None
        if self.enabled:
            self._file = open(run_dir / "metrics.jsonl", "a", buffering=1)
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, kind: str, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time(), 3)}
        record.update({k: _jsonable(v) for k, v in values.items()})
        try:
            self._file.write(json.dumps(record) + "\n")
            for key, value in values.items():
                value = _jsonable(value)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self.disk_full, self.enabled = exc, False  # the run reads this and stops every rank

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None


def progress(total: int | None, initial: int, enabled: bool, desc: str) -> tqdm:
    """A bar on rank 0; none when TRAINERS_PROGRESS=0 (a detached job's log is read later, not watched).
    Drawn from its first second on: a bar closed sooner (a cohort member's run quiets its own as it
    opens) leaves nothing, where it used to leave a "0%" line per symbol in a log that is not a terminal."""
    enabled = enabled and os.environ.get("TRAINERS_PROGRESS", "1") != "0"
    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, dynamic_ncols=True,
                mininterval=1.0, delay=1.0)


class StepLog:
    """What a loop shows and records step by step: the progress bar (rank 0) and the training row
    that waits for its window's throughput, written when the step ends."""

    def __init__(self, metrics: MetricsWriter, total: int | None, enabled: bool, desc: str, metric_name: str):
        self.metrics, self.desc, self.metric_name = metrics, desc, metric_name
        self.bar = progress(total, 0, enabled, desc)
        self._pending: tuple[int, dict] | None = None

    def start(self, step: int, total: int | None) -> None:
        self.bar.reset(total=total)
        self.bar.update(step)

    def record(self, step: int, values: dict) -> None:
        self._pending = (step, dict(values))
        loss = next((v for k, v in values.items() if "loss" in k or "fraction" in k), None)
        if isinstance(loss, float):
            self.bar.set_postfix({self.metric_name: f"{loss:.4f}"})

    def step_ended(self, window) -> None:
        """`window()`: the throughput of the window this row closes (called only when one waits)."""
        self.bar.update(1)
        if self._pending is not None:
            step, values = self._pending
            self.metrics.log(step, "train", {**values, **window()})
            self._pending = None

    def quiet(self) -> None:
        self.bar.leave = False  # closing erases the line it drew
        self.bar.close()
        self.bar = progress(None, 0, False, self.desc)

    def close(self) -> None:
        self.bar.close()
