"""The job queue: symbols spread over every worker of every node through torchrun's own c10d store.

    pending = [symbols without a done marker]       rank 0 scans the job folder, once per attempt
    token   = a fresh id per attempt                 broadcast with the list (the only collective)
    claim   = store.add(f"{token}/next", 1) - 1      atomic: each index goes to exactly one worker

No scheduler of our own: a worker that finishes early simply claims the next index, so fast workers
take more symbols and the last ones start wherever a worker is free.

Why claims cannot be lost. A claim is not a completion: only `symbols/<S>/done.json` (written
atomically after the symbol's evaluation, status ok or failed) marks a symbol finished. When a
worker is SIGKILLed, torchrun stops the others and starts a new attempt; the new attempt re-scans
the folder, so every symbol that was claimed but not finished is pending again and resumes from
its own newest checkpoint. The agent's store outlives the workers and keeps the old counter, so
each attempt counts under its own token. Failed symbols stay failed across restarts of one launch
(their error is recorded) and are tried again by the next launch.

Stops. A worker that gets a signal or runs out of the job's budget publishes a stop record
(`compare_set`: the first record wins); the others read it at most every POLL_S seconds during
training and stop their own symbol at the next step, with a checkpoint. At the end every worker
adds 1 to `finished`; rank 0 waits for all of them (at most GRACE_S once it was signalled itself:
torchrun's SIGKILL follows SIGTERM after 30 s) and writes the job's summary.

The store is lost when torchrun's agent dies (`kill -9` of the agent: its workers get SIGTERM from
PR_SET_PDEATHSIG, trainers.runtime.dist.end_with_parent). Every call here then answers as if the job
had been stopped (no more claims, a stop record) instead of raising, so each worker checkpoints its
symbol and leaves, and rank 0 still writes the summary of what is on disk.

Single process (no torchrun): the same code on an in-memory store.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch.distributed as dist

from trainers.runtime.dist import DistContext
from trainers.runtime.files import atomic_write_json

POLL_S = 0.5
GRACE_S = 2.0
DONE = "done.json"
RETRYING = "retrying"  # a done.json's status while its symbol is trained again: not done (set_aside_marker)
LOST = "device_lost.json"  # in a symbol's folder: how many times a CUDA context broke while it was being trained


def open_store(ctx: DistContext, timeout_s: float):
    """The store torchrun's agent hosts (TORCHELASTIC_USE_AGENT_STORE, the default) or, under another
    launcher, the one rank 0's process group hosts; an in-memory one without torchrun."""
    if not ctx.distributed:
        return dist.HashStore()
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def _read_done(symbol_dir: Path) -> dict:
    """done.json as written, whatever its status ({} when absent or unreadable)."""
    try:
        marker = json.loads((symbol_dir / DONE).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return marker if isinstance(marker, dict) else {}


def read_marker(symbol_dir: Path) -> dict | None:
    """The done marker, or None (absent or unreadable: a half-written marker never counts as done; nor does a
    symbol being trained again, RETRYING)."""
    marker = _read_done(symbol_dir)
    return marker if marker.get("status") in ("ok", "failed") else None


def write_marker(symbol_dir: Path, marker: dict) -> None:
    atomic_write_json(symbol_dir / DONE, marker)


def set_aside_marker(symbol_dir: Path) -> None:
    """A failed symbol tried again by a new launch (--restart marked its symbols already: mark_restart): as its
    training starts its marker becomes {"status": "retrying", "before": the old one}, which marks nothing done, so a retry that the job's
    stop interrupts shows as stopped (the next run resumes it), not as the old failure with the job's exit 1. It is
    written over, not moved: the job's mirror uploads it over the remote's copy (a mirror never deletes), where a
    pod lost in the retry would otherwise find the old failure again."""
    marker = read_marker(symbol_dir)
    if marker is not None:
        write_marker(symbol_dir, {"status": RETRYING, "before": marker})


def mark_restart(symbol_dir: Path) -> None:
    """--restart, as the launch starts: the symbol (one that has a folder) is to start over, whichever launch or
    process opens its run next: {"status": "retrying", "restart": true, "before": its old marker or None}. Marked
    at once for every symbol asked for: a restart stopped before a symbol's turn once left it with its old model,
    and the next launch (without --restart) trained nothing; and a pod lost then resumed the old run's newest
    checkpoint from the remote. Cleared only by its done marker: a run stopped after its restart starts over
    again (its progress since the restart is lost, never the old model taken for the new one)."""
    if symbol_dir.is_dir():
        write_marker(symbol_dir, {"status": RETRYING, "restart": True, "before": read_marker(symbol_dir)})


def restart_marked(symbol_dir: Path) -> bool:
    marker = _read_done(symbol_dir)
    return marker.get("status") == RETRYING and marker.get("restart") is True


def times_lost(symbol_dir: Path) -> int:
    """How many times a CUDA context broke while the symbol was being trained (trainers.lstm.markers.remember_lost)."""
    try:
        count = json.loads((symbol_dir / LOST).read_text()).get("count")
    except (OSError, ValueError, AttributeError):
        return 0
    return count if isinstance(count, int) and count > 0 else 0


def pending_symbols(job_dir: Path, symbols: list[str], retry_failed: bool) -> tuple[list[str], dict]:
    """Symbols to train in this attempt and the counts by state: in the job's order, except that a symbol in
    training when a CUDA context broke comes after the others (the fewer times the sooner): if it is the cause,
    it breaks the next attempt only once everything else is done."""
    pending, counts = [], {"ok": 0, "failed": 0, "pending": 0}
    for s in symbols:
        marker = read_marker(job_dir / "symbols" / s)
        state = "pending" if marker is None or (marker["status"] == "failed" and retry_failed) else marker["status"]
        counts[state] += 1
        if state == "pending":
            pending.append(s)
    return sorted(pending, key=lambda s: times_lost(job_dir / "symbols" / s)), counts


class JobQueue:
    def __init__(self, store, token: str, pending: list[str]):
        self.store = dist.PrefixStore(f"trainers/lstm/{token}/", store)
        self.token = token
        self.pending = pending
        self._next_poll = 0.0
        self._stop: dict | None = None
        self.lost: str | None = None  # why the store cannot be reached (its agent is gone)

    def _store_lost(self, exc: Exception) -> dict:
        self.lost = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        if self._stop is None:
            self._stop = {"reason": "signal", "signal": "the job's store is gone (torchrun's agent died)",
                          "worker": None, "symbol": None, "step": None, "error": self.lost}
        return self._stop

    def claim(self) -> tuple[int, str] | None:
        """(index, symbol) of the next unclaimed symbol; None when all are taken (or the store is gone)."""
        try:
            index = int(self.store.add("next", 1)) - 1
        except dist.DistError as exc:
            self._store_lost(exc)
            return None
        return (index, self.pending[index]) if index < len(self.pending) else None

    def request_stop(self, record: dict) -> dict:
        """Publish why the job stops; returns the record in force (the first one published wins)."""
        try:
            self._stop = json.loads(self.store.compare_set("stop", "", json.dumps(record)))
        except dist.DistError as exc:
            self._stop = self._stop or record  # nobody else can hear it: this worker's own reason stands
            self._store_lost(exc)
        return self._stop

    def stop_record(self, force: bool = False) -> dict | None:
        """The published stop record, if any (read from the store at most every POLL_S seconds)."""
        if self._stop is None and (force or time.monotonic() >= self._next_poll):
            self._next_poll = time.monotonic() + POLL_S
            try:
                if self.store.check(["stop"]):
                    self._stop = json.loads(self.store.get("stop"))
            except dist.DistError as exc:
                return self._store_lost(exc)
        return self._stop

    def worker_done(self) -> None:
        try:
            self.store.add("finished", 1)
        except dist.DistError as exc:
            self._store_lost(exc)

    def wait_for_workers(self, world_size: int, deadline: float | None) -> int:
        """Poll until every worker is done (or the deadline passes, or the store is gone); returns how
        many are known to be."""
        done = 0
        while True:
            try:
                done = int(self.store.add("finished", 0))
            except dist.DistError as exc:
                self._store_lost(exc)
                return done
            if done >= world_size or (deadline is not None and time.monotonic() >= deadline):
                return done
            time.sleep(0.2)
