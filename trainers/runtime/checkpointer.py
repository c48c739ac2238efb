"""When and how a run's checkpoints are written: the cadence, the write in the loop or behind it, and
the commit protocol. (What a checkpoint is on disk, and resuming from one, is `checkpoint.py`'s.)

Cadence: every `--ckpt-every` optimizer steps, and every `--ckpt-every-min` minutes of rank 0's
clock (rank 0's "due" rides on the stop agreement, so every rank saves at the same step).

With `--ckpt-async` (default on CUDA) the loop only waits for a copy of the states into host memory;
a background thread writes and hashes the files while training goes on. The on-disk contract is
the same as a synchronous save:

- the files are written atomically, and the checkpoint only becomes complete when rank 0 writes its
  meta, which needs every rank's checksums; that commit is a collective, so it happens at a step
  boundary every rank agrees on: the stop agreement carries "my write is still running" and "my
  write failed" (max over ranks), and the first agreement where no rank is still writing commits;
- at most one write is in flight: the next save first waits for the previous one and commits it;
- a stop waits for its save and commits it before the loop ends (`settle`), so the newest complete
  checkpoint is still the last step trained;
- a kill while a write is in flight leaves files without a meta: never resumed from, removed by the
  next prune; the run resumes from the previous complete checkpoint;
- a write that fails (disk full) stops every rank at the next agreement, in one line.

FSDP2's sharded states (torch.distributed.checkpoint) are written synchronously.

`hold` (`--ckpt-at-eval held`): an evaluation's new best is copied into host memory (the states, this rank's data
position and RNG streams at that step) and written as that step's checkpoint with the next write: before the next
save (the cadence's, a stop's), at `settle` (the loop's end), before the best is read back. A newer best replaces it
unwritten. Why: an LSTM cohort member's saves were most of its bookkeeping (`step_done`, 24.4 s of the 500-symbol
job's 59.6 s of members' time on the H200, bench/results/gpu_h200/), and most new bests are replaced before the
member ends. What it costs: a kill loses what was held (the run resumes from the last checkpoint written), and so
does a stop whose write of it fails (a full disk). `for_run` says which runs hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trainers.errors import RunFailed
from trainers.runtime import device as device_mod
from trainers.runtime import rng
from trainers.runtime.async_save import BackgroundWrite, HostSnapshot
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.dist import DistContext, all_reduce_max, barrier, broadcast_object
from trainers.runtime.files import is_disk_full
from trainers.runtime.options import RunOptions


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


@dataclass
class Start:
    """Where a loop continues: the last finished step and this rank's data position."""

    step: int = 0
    position: dict | None = None  # this rank's own position; None on a fresh start or a new world size
    position_rank0: dict | None = None  # rank 0's position (what a changed world size can fall back to)
    resumed: bool = False
    ended: bool = False  # the checkpoint is where training stopped early: no step is left to train (Run.resume)


class Checkpointer:
    def __init__(self, manager: CheckpointManager, ctx: DistContext, every_steps: int, every_min: float | None,
                 write_behind: bool | None = None, hold_bests: bool = False):
        self.manager = manager
        self.hold_bests = hold_bests  # `hold`: --ckpt-at-eval held
        self.ctx = ctx
        self.every_steps = every_steps
        self.every_min = every_min
        # A GPU gains from the host copy; on a CPU the background write would compete for the cores.
        self.write_behind = ctx.device.type == "cuda" if write_behind is None else write_behind
        self.last_saved_step = -1
        self.slowest_s = 0.0  # the slowest save seen, the whole write included (the budget's reserve)
        self.writes_behind_s = 0.0  # write time overlapped with training
        self._last_save_time = time.monotonic()
        self._pending: BackgroundWrite | None = None
        self._snapshot = HostSnapshot()
        self._held: tuple[int, dict, dict] | None = None  # (step, its host copy, its meta): `hold`
        self._held_snapshot = HostSnapshot()  # (its own buffers: a write behind may be reading the other's)

    @classmethod
    def for_run(cls, run_dir: Path, ctx: DistContext, cfg: RunOptions, log, gpu_like: bool) -> "Checkpointer":
        """A run's: its folder's checkpoints, the run's options, and (unless --ckpt-async says) a
        write behind the loop where a GPU deploy makes one."""
        manager = CheckpointManager(Path(run_dir) / "checkpoints", ctx, cfg.keep_last, log)
        # not under a budget of the run's own: its end keeps time for the final save, measured on the saves before,
        # and a best held would make it two writes none of them measured
        holds = cfg.ckpt_at_eval == "held" and cfg.budget(ctx.world_size).limit_s() is None
        write_behind = gpu_like if cfg.ckpt_async is None else cfg.ckpt_async
        return cls(manager, ctx, cfg.ckpt_every, cfg.ckpt_every_min, write_behind, holds)

    # ---- cadence -------------------------------------------------------------------------------
    def due_by_steps(self, step: int) -> bool:
        return step % self.every_steps == 0

    def due_by_time(self) -> bool:
        """Rank 0's clock (agree on it before acting)."""
        return bool(self.ctx.is_main and self.every_min
                    and time.monotonic() - self._last_save_time >= self.every_min * 60)

    def resume(self, states: dict[str, Stateful], sharded_states: dict[str, Stateful], restart: bool, seed: int,
               log) -> tuple[Start, dict | None]:
        """Collective: load the newest verified checkpoint into `states` (and `sharded_states` in
        place) and restore this rank's RNG streams; on a fresh start seed them (`seed` offset by the
        rank). Returns where the loop continues and the run's own saved counters (None: fresh).
        `restart` (--restart) first moves every checkpoint aside."""
        if restart:
            aside = self.manager.set_aside() if self.ctx.is_main else None
            barrier(self.ctx)
            if aside is not None:
                log.warning("--restart: starting over from step 0; the old checkpoints are in %s", aside)
        resumed = self.manager.resume(self.ctx.device, sharded=sharded_states or None)
        if resumed is None:
            rng.seed_everything(rng.rank_seed(seed, self.ctx.rank))
            return Start(), None
        for name, obj in states.items():
            obj.load_state_dict(resumed.shared["states"][name])
        self.last_saved_step = resumed.step
        saved, position = resumed.shared["run"], None
        if resumed.rank_state is not None:
            rng.restore(resumed.rank_state["rng"], self.ctx.device)
            position = resumed.rank_state["position"]
        else:  # another world size: this rank's streams cannot be mapped
            rng.seed_everything(rng.rank_seed(seed, self.ctx.rank) + resumed.step)
        log.info("resumed from checkpoint step %d%s", resumed.step, f" (position {position})" if position else "")
        return Start(resumed.step, position, saved["position_rank0"], True), saved

    def restore_best(self, names: tuple[str, ...], states: dict[str, Stateful], sharded_states: dict[str, Stateful]
                     ) -> int | None:
        """Collective. Load the best complete checkpoint (lowest validation metric; else the newest)
        into the named states (plain or sharded), after checking its SHA-256. Its step, or None."""
        self.settle()
        if self.manager.apart:  # node 0's folder alone holds the files: rank 0 reads them for every rank
            plain = tuple(n for n in names if n not in sharded_states)
            step, saved = broadcast_object(self.ctx, self._best_states(plain) if self.ctx.is_main else None)
            for name in plain if step is not None else ():
                states[name].load_state_dict(saved[name])
            sharded = {n: sharded_states[n] for n in names if n in sharded_states}
            if sharded and step is not None:
                self.manager.load_sharded(step, sharded)  # (each rank's parts sent to it: trainers.runtime.apart)
            return step
        steps = self.manager.complete_steps()
        if not steps:
            return None
        best = self.manager.best_step()
        step = steps[0] if best is None else best
        plain = [n for n in names if n not in sharded_states]
        if plain:
            saved = self.manager.load_verified(step, self.ctx.device)["states"]
            for name in plain:
                states[name].load_state_dict(saved[name])
        sharded = {n: sharded_states[n] for n in names if n in sharded_states}
        if sharded:
            self.manager.load_sharded(step, sharded)
        return step

    def _best_states(self, names: tuple[str, ...]) -> tuple[int | None, dict | None]:
        """Rank 0, `apart`: the step `restore_best` picks and its named states, on the host."""
        steps = self.manager.complete_steps()
        if not steps:
            return None, None
        best = self.manager.best_step()
        step = steps[0] if best is None else best
        saved = self.manager.load_verified(step, torch.device("cpu"))["states"]
        return step, {name: saved[name] for name in names}

    # ---- the write -----------------------------------------------------------------------------
    def save(self, step: int, shared: dict[str, Any], position: dict | None, meta: dict[str, Any],
             sharded: dict[str, Any] | None = None, best_only: bool = False) -> float:
        """Collective (every rank at the same step): `shared` from rank 0, this rank's data
        `position` and RNG streams in its own file. Returns the seconds the loop stood still. A write
        that fails on any rank raises WriteFailed on every rank (disk full or not). `best_only`: only an
        evaluation's new best asks for it; with `hold_bests` (not at a step-cadence save, not for sharded
        states, written from the device) it is held instead (`hold`)."""
        if best_only and self.hold_bests and not sharded and not self.due_by_steps(step):
            return self.hold(step, shared, position, meta)
        device_mod.synchronize(self.ctx.device)  # the steps' queued kernels are theirs, not the save's stall
        t0 = time.perf_counter()
        rank_state = self.manager.gather_rank_states({"position": position, "rng": rng.capture(self.ctx.device)})
        self.settle()  # one write in flight at most
        if sharded:
            self.manager.save(step, shared, rank_state, meta, sharded=sharded)
        elif self.write_behind:
            snap = self._snapshot.take({"shared": shared if self.ctx.is_main else None, "rank": rank_state})
            self._pending = BackgroundWrite(step, meta,
                                            lambda: self.manager.write_local(step, snap["shared"], snap["rank"]))
        else:
            self._write_here(step, meta, shared, rank_state)
        self.last_saved_step = step
        self._last_save_time = time.monotonic()
        stalled = time.perf_counter() - t0
        self.slowest_s = max(self.slowest_s, stalled)
        return stalled

    def hold(self, step: int, shared: dict[str, Any], position: dict | None, meta: dict[str, Any]) -> float:
        """Collective (every rank at the same step): `save`'s arguments copied into host memory, written as step
        `step`'s checkpoint with the next write (`settle`), unless a newer `hold` replaces it first. Returns the
        seconds the loop stood still (the copy)."""
        device_mod.synchronize(self.ctx.device)
        t0 = time.perf_counter()
        rank_state = self.manager.gather_rank_states({"position": position, "rng": rng.capture(self.ctx.device)})
        copy = self._held_snapshot.take({"shared": shared if self.ctx.is_main else None, "rank": rank_state})
        self._held = (step, copy, meta)
        self.last_saved_step = step
        return time.perf_counter() - t0

    @property
    def held_step(self) -> int | None:
        return self._held[0] if self._held is not None else None

    def settle_as_it_fails(self, log) -> None:
        """`settle` as the run stops for a failure (a divergence, a full disk): a write that fails too is logged,
        and the run ends for its own reason (a retry would meet it again)."""
        try:
            self.settle()
        except WriteFailed as exc:
            log.error("%s", exc)

    def write_status(self) -> tuple[float, float]:
        """This rank's (writing, failure), for the stop agreement to carry: failure 2 for a full
        disk, 1 for any other error (the max over ranks wins)."""
        pending = self._pending
        writing = pending is not None and not pending.done()
        return float(writing), 0.0 if writing else self._failure_code(pending)

    def agreed(self, any_writing: bool, failure: float) -> None:
        """Collective, after an agreement that carried `write_status`: a failure anywhere stops every
        rank; no rank still writing completes the checkpoint."""
        if self._pending is None:
            return
        if failure > 0:
            self._write_failed(self._pending, failure)
        elif not any_writing:
            self._commit()

    def settle(self) -> float:
        """Collective: wait for the write in flight, then complete it (or stop every rank with the
        failure). Returns the seconds waited (the loop stands still)."""
        if self._pending is None and self._held is None:
            return 0.0
        t0 = time.perf_counter()
        if self._pending is not None:
            self._complete(self._pending)
        if self._held is not None:  # (a later step than the write in flight: written after it)
            step, copy, meta = self._held
            self._held = None
            self._write_here(step, meta, copy["shared"], copy["rank"])
        return time.perf_counter() - t0

    def _write_here(self, step: int, meta: dict[str, Any], shared: dict[str, Any] | None, rank_state: dict) -> None:
        """Step `step`'s files written in the loop, then committed; agreed like a write behind the loop (a rank
        whose write failed tells the others)."""
        self._pending = BackgroundWrite(step, meta, lambda: self.manager.write_local(step, shared, rank_state),
                                        in_thread=False)
        self._complete(self._pending)

    def _complete(self, pending: BackgroundWrite) -> None:
        pending.wait()
        failure = all_reduce_max(self.ctx, [self._failure_code(pending)])[0]
        if failure > 0:
            self._write_failed(pending, failure)
        self._commit()

    def _failure_code(self, pending: BackgroundWrite | None) -> float:
        if pending is None or pending.error is None:
            return 0.0
        return 2.0 if is_disk_full(pending.error, self.manager.dir / "x") else 1.0

    def _commit(self) -> None:
        pending, self._pending = self._pending, None
        self.manager.commit(pending.step, pending.files, pending.meta)
        if pending.in_thread:
            self.writes_behind_s += pending.seconds
        # a final save is waited for: the budget's reserve counts the whole write, not the copy
        self.slowest_s = max(self.slowest_s, pending.seconds)

    def _write_failed(self, pending: BackgroundWrite, failure: float) -> None:
        """Every rank stops here together (the failure came through a collective)."""
        self._pending = None
        steps = self.manager.complete_steps()
        where = f"this rank: {pending.error}" if pending.error is not None else "on another rank"
        raise WriteFailed(f"writing the checkpoint of step {pending.step} failed ({where}); the newest complete "
                          f"checkpoint is {'step ' + str(steps[0]) if steps else 'none'}: fix the disk and run the "
                          f"same command to resume from it", disk_full=failure >= 2)


class WriteFailed(RunFailed):
    """A checkpoint could not be written on some rank; every rank raises it at the same step."""

    def __init__(self, message: str, disk_full: bool):
        super().__init__(message)
        self.disk_full = disk_full
