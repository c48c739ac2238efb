"""The run folder: opening it for a training run, and reading it back (config, checkpoints).

    <run>/config.json      the resolved config, written once by the first run
    <run>/training.log     rank 0's log
    <run>/metrics.jsonl    one JSON object per logged step (and TensorBoard events beside it)
    <run>/checkpoints/     see trainers.runtime.checkpoint
    <run>/results.json     see trainers.runtime.results
    <run>/heartbeat.json   rank 0's elapsed time and step, every HEARTBEAT_S seconds (`Heartbeat`)
    <run>/data.json        the fingerprint of the data the run started with (`check_data_unchanged`)
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from trainers.errors import CheckPassed, UsageError
from trainers.runtime import apart, nodewatch
from trainers.runtime import config as cfgmod
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.dist import DistContext, all_gather_object, barrier, broadcast_object
from trainers.runtime.files import DiskFull, atomic_write_json, remove_stale_temp_files
from trainers.runtime.lock import LOCK_NAME, FolderLock, describe_holder, held_by_other
from trainers.runtime.logs import MetricsWriter, get_logger

HEARTBEAT = "heartbeat.json"
HEARTBEAT_S = 30.0
DATA_RECORD = "data.json"


@contextlib.contextmanager
def exclusive(run_dir: Path, ctx: DistContext | None = None):
    """Hold the run folder's lock for a command that writes into it (evaluate, export): refused in
    one line, on every rank, while training (or another command) holds it."""
    ctx = ctx or single_process_context()
    lock, problem = None, None
    if ctx.is_main:
        try:
            lock = FolderLock(Path(run_dir)).acquire()
        except UsageError as exc:
            problem = str(exc)
    problem = broadcast_object(ctx, problem)
    if problem:
        raise UsageError(problem)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def take_run_folder(run_dir: Path, ctx: DistContext, trainer: str, data_fingerprint: str | None,
                    restart: bool = False) -> FolderLock | None:
    """Collective: rank 0 locks the run folder for the job's life (one job per folder; the caller
    releases the lock it returns); every rank gets the same one-line refusal when another job holds
    it, or when the folder was trained on other data. Leftover temp files of a killed writer are
    removed once the lock is ours. `TRAINERS_CHECK_ONLY=1` stops here with CheckPassed: every check
    a run makes before its first write has passed (the deploy kit runs this before torchrun, so a
    usage error is not retried --max-restarts times)."""
    check_only = os.environ.get("TRAINERS_CHECK_ONLY") == "1"
    problem, lock = None, None
    same_data_on_every_rank(ctx, data_fingerprint)
    if ctx.distributed and apart.run_dir_apart():
        apart.refuse_unless_rank0_on_node0(ctx)
    if ctx.is_main:
        try:
            check_data_unchanged(run_dir, data_fingerprint, restart)
            if check_only:
                holder = held_by_other(run_dir)
                if holder:
                    raise UsageError(f"--run-dir {run_dir} is in use by {describe_holder(holder)}")
            else:
                lock = FolderLock(run_dir, hint=" (`bash deploy_8gpu.sh stop`)")
                lock.acquire(warn=lambda msg: print(f"warning: {msg}", file=sys.stderr))
                remove_stale_temp_files(run_dir)
        except UsageError as exc:
            problem = str(exc)
    problem = broadcast_object(ctx, problem)
    if problem:
        if lock is not None:
            lock.release()
        raise UsageError(problem)
    if check_only:
        raise CheckPassed(f"{trainer}: every check before training passed for {run_dir}")
    return lock


def same_data_on_every_rank(ctx: DistContext, data_fingerprint: str | None) -> None:
    """Collective: every rank read the same data, or every rank is refused in one line. On one shared disk the ranks
    read one cache; on nodes without one each node fetched its own (the same source and pinned dates), and a source
    that answered two nodes differently would train each rank on other rows. (None: a rank that records none.)"""
    prints = all_gather_object(ctx, data_fingerprint)
    known = {fingerprint for fingerprint in prints if fingerprint is not None}
    if len(known) > 1:
        said = ", ".join(f"rank {rank}: {fingerprint[:12]}" for rank, fingerprint in enumerate(prints) if fingerprint)
        raise UsageError(f"the ranks read different data ({said}): every node must read the same data; nodes without "
                         "a shared disk each fetch it, so give them a pinned range (--start/--end) or the same file")


@contextlib.contextmanager
def undone_on_refusal(run_dir: Path, ctx: DistContext, opened: contextlib.ExitStack):
    """A start refused inside (a remote that cannot be written, after the lock made the run folder) writes nothing:
    what `opened` holds is closed (the lock released), then the lock file and each folder the start created go."""
    created = None
    for path in (run_dir, *run_dir.parents):  # the outermost folder this start will create
        if path.exists():
            break
        created = path
    try:
        yield
    except UsageError:
        opened.close()
        if ctx.is_main and created is not None:
            (run_dir / LOCK_NAME).unlink(missing_ok=True)
            for path in (run_dir, *run_dir.parents):
                with contextlib.suppress(OSError):  # (not empty: something else is in it, and it stays)
                    path.rmdir()
                if path == created:
                    break
        raise


def single_process_context(device: str = "cpu") -> DistContext:
    return DistContext(0, 0, 1, 1, torch.device(device), None)


def open_run_dir(run_dir: Path, cfg, ctx: DistContext, data_fingerprint: str | None = None, restart: bool = False):
    """Create the run folder, write config.json (and the data's fingerprint) on the first run, and
    return (logger, metrics). Call it after every check that can reject the input, so bad input
    writes nothing."""
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / "config.json").exists():
            atomic_write_json(run_dir / "config.json", cfgmod.to_dict(cfg))
        if data_fingerprint is not None and (restart or not (run_dir / DATA_RECORD).exists()):
            atomic_write_json(run_dir / DATA_RECORD, {"fingerprint": data_fingerprint})
    barrier(ctx)
    return get_logger(ctx.rank, run_dir), MetricsWriter(run_dir, enabled=ctx.is_main)


def load_run_config(run_dir: Path, cls):
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise UsageError(f"--run-dir {run_dir} holds no config.json; point it at a folder written by a training run")
    try:
        saved = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); it was not written by a training run") from None
    names = {f for f in cls.__dataclass_fields__}
    return cls(**{k: v for k, v in saved.items() if k in names})


def is_step_number(which: str) -> bool:
    """A --checkpoint naming a step: ASCII digits ("²" is a digit to str.isdigit, and int() refuses it)."""
    return which.isascii() and which.isdigit()


def resolve_checkpoint(ckpt: CheckpointManager, which: str) -> int:
    """`best` (lowest validation metric, else newest), `latest`, or a step number."""
    steps = ckpt.complete_steps()
    if not steps:
        raise UsageError(f"{ckpt.dir} holds no complete checkpoint; train first")
    if which == "latest":
        return steps[0]
    if which == "best":
        best = ckpt.best_step()
        return steps[0] if best is None else best
    if not is_step_number(which) or int(which) not in steps:
        raise UsageError(f"--checkpoint {which!r} is not best, latest or one of the steps {sorted(steps)}")
    return int(which)


def load_checkpoint_states(run_dir: Path, which: str = "best", device: str = "cpu") -> tuple[int, dict]:
    """(step, {state name: state dict}) of a run's checkpoint, verified against its SHA-256."""
    import logging

    ckpt = CheckpointManager(Path(run_dir) / "checkpoints", single_process_context(), 1, logging.getLogger("trainers"))
    step = resolve_checkpoint(ckpt, which)
    return step, ckpt.load_verified(step, device)["states"]


class Heartbeat:
    """Rank 0 records the run's elapsed time every HEARTBEAT_S seconds: what a crash would otherwise
    take from the budget's clock (the checkpoint only knows the time up to its own step). `status`
    reads it too (step, total, pid)."""

    def __init__(self, run_dir: Path, ctx: DistContext, trainer: str, total_steps: int | None, mirror=None):
        self.path = Path(run_dir) / HEARTBEAT
        self.mirror = mirror  # --remote: its lag goes into each beat, and each beat is uploaded (`status --remote`)
        self.ctx = ctx
        self.trainer = trainer
        self.total_steps = total_steps
        self.disk_full: OSError | None = None  # a beat found the volume full: the run stops on it
        self._last = 0.0

    def beat(self, step: int, elapsed_s: float, force: bool = False) -> None:
        nodewatch.at(step)  # (every rank: the node's first worker's beat through the store carries it)
        now = time.monotonic()
        if not self.ctx.is_main or self.disk_full or (not force and now - self._last < HEARTBEAT_S):
            return
        self._last = now
        remote = self.mirror.lag() if self.mirror is not None else None
        try:
            atomic_write_json(self.path, {"elapsed_s": elapsed_s, "step": step, "total_steps": self.total_steps,
                                          "world_size": self.ctx.world_size, "trainer": self.trainer,
                                          "time": time.time(), "pid": os.getpid(),
                                          **({"remote": remote} if remote is not None else {})})
        except DiskFull as exc:
            self.disk_full = exc
            return
        if self.mirror is not None and not force:  # (every HEARTBEAT_S: not at each save's forced beat, which
            self.mirror.sync()                     # re-sent the growing metrics and logs every few steps)

    def elapsed_including_lost_time(self, checkpoint_elapsed: float, log) -> float:
        """Collective (rank 0 reads, all agree): the elapsed time of an earlier attempt that ran on
        after its last checkpoint (it crashed or was killed), else the checkpoint's own."""
        beat = None
        if self.ctx.is_main:
            try:
                beat = json.loads(self.path.read_text()).get("elapsed_s")
            except (OSError, ValueError, AttributeError):
                beat = None
        beat = broadcast_object(self.ctx, beat)
        if isinstance(beat, (int, float)) and beat > checkpoint_elapsed:
            log.info("counting %.0f s an earlier attempt spent after its last checkpoint", beat - checkpoint_elapsed)
            return float(beat)
        return checkpoint_elapsed

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def fingerprint_to_check(run_dir: Path, fingerprint: str | None) -> str | None:
    """`fingerprint`, or None for a run folder that holds checkpoints but no data record: a run trained before
    its trainer recorded its data (the forecaster's, until it did), resumed and evaluated unchecked as before
    rather than refused. A record deleted since looks the same, and goes unchecked too."""
    return None if holds_checkpoints(run_dir) and not (Path(run_dir) / DATA_RECORD).exists() else fingerprint


def holds_checkpoints(run_dir: Path) -> bool:
    checkpoints = Path(run_dir) / "checkpoints"
    return checkpoints.is_dir() and any(p.name.startswith(("meta_", "model_")) for p in checkpoints.iterdir())


def check_data_unchanged(run_dir: Path, fingerprint: str | None, restart: bool = False,
                         instead: str | None = None) -> None:
    """A run trains on one dataset: a resume whose data fingerprint differs from the one the run
    started with is refused (its positions and checkpoints index into the old data), and so is one
    whose record is unreadable or gone while checkpoints remain (the data could have changed
    unseen). `--restart` starts over on whatever data it is given. `instead`: what the user can do, for a
    command that is not a resume (an evaluation, an export: it has no --restart)."""
    if fingerprint is None or restart:
        return
    path = Path(run_dir) / DATA_RECORD
    trained = holds_checkpoints(run_dir)
    or_restart = "" if instead else ", or start over with --restart"
    if not path.exists():
        if trained:
            raise UsageError(f"--run-dir {run_dir} holds checkpoints but no {DATA_RECORD} (the fingerprint of the data "
                             f"they were trained on): restore it{or_restart}")
        return
    try:
        saved = json.loads(path.read_text())["fingerprint"]
        if not isinstance(saved, str):
            raise TypeError(f"fingerprint is a {type(saved).__name__}")
    except (OSError, ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is unreadable ({exc}); it records the data this run trained on: restore it"
                         f"{or_restart}") from None
    if saved != fingerprint:
        raise UsageError(f"--run-dir {run_dir} was trained on other data (fingerprint {saved[:12]}..., now "
                         f"{fingerprint[:12]}...); "
                         f"{instead or 'resume with the data it started with, or use a new --run-dir'}")
