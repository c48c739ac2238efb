"""The two pieces a checkpoint written behind the loop is made of (the protocol around them, when to
commit and what a failure does, is `trainers.runtime.checkpointer`'s):

- `HostSnapshot`: a copy of the states in host memory, so training can go on mutating the originals.
  On CUDA the buffers are pinned and reused between saves, so the copy runs at PCIe speed;
- `BackgroundWrite`: a thread that writes and hashes the files from that copy.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Callable

import torch

from trainers.runtime import device as device_mod
from trainers.runtime.device import host_buffer, pinnable


class HostSnapshot:
    """Copies of nested states (dicts, lists, tuples, tensors, plain values) in host memory, in
    buffers reused when the next save has the same shapes (one write is in flight at a time, so a
    buffer is never read while it is refilled). On CUDA they are pinned and the copies non-blocking;
    `reuse=False` clones instead (a CPU run: its tensors are host memory already)."""

    def __init__(self, reuse: bool = True) -> None:
        self.reuse = reuse
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, obj: Any) -> Any:
        out = self._copy(obj, "")
        device_mod.synchronize()  # the non-blocking device-to-host copies are done before the thread reads
        return out

    def _copy(self, obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return type(obj)(self._copy(v, f"{path}/{i}") for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def _tensor(self, t: torch.Tensor, path: str) -> torch.Tensor:
        t = t.detach()
        if not (self.reuse or pinnable(t.device)):
            return t.clone()  # training goes on mutating the original in place
        buf = self._buffers.get(path)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = host_buffer(t)
            self._buffers[path] = buf
        buf.copy_(t, non_blocking=pinnable(t.device))
        return buf


# Writes behind the loop take turns, one at a time in a process. Pickling holds the GIL, and the loop's thread
# lets it go around every op (on a GPU, every launch), then waits to get it back: on the dev VM a tiny op took 11x
# as long as alone with 4 writers at once, 2x with 4 taking turns, and the turns wrote more saves a second
# (bench/gil_convoy.py; bench/results/gil_convoy_cpu.json, `slowdown`). It matters where one process writes many
# checkpoints at once: an LSTM cohort, each member its own run, all saving at an epoch's end. The files' I/O takes
# turns too, and a write that hangs holds the others back (each run waits for its own write before its next save
# anyway); a write's `seconds` count its wait for a turn.
_ONE_AT_A_TIME = threading.Lock()


class BackgroundWrite:
    """One checkpoint's files, written by a thread (or, `in_thread=False`, right here: the same
    record for a write in the loop). After `done()`: `files` (the checksums) or `error` (what the
    write raised, re-raised by the caller once every rank knows). Threads take turns (_ONE_AT_A_TIME);
    a write in the loop does not wait for theirs."""

    def __init__(self, step: int, meta: dict[str, Any], write: Callable[[], dict[str, str]], in_thread: bool = True):
        self.step = step
        self.meta = meta
        self.files: dict[str, str] | None = None
        self.error: BaseException | None = None
        # from the request to the files on disk, a turn's wait included: what a final save makes the loop wait
        # (the budget's reserve) and how long the write ran behind the loop
        self.seconds = 0.0
        self.in_thread = in_thread
        self._thread = None
        requested = time.perf_counter()
        if in_thread:
            self._thread = threading.Thread(target=self._run_in_turn, args=(write, requested),
                                            name=f"checkpoint-{step}", daemon=True)
            self._thread.start()
        else:
            self._run(write, requested)

    def _run_in_turn(self, write: Callable[[], dict[str, str]], requested: float) -> None:
        with _ONE_AT_A_TIME:
            self._run(write, requested)

    def _run(self, write: Callable[[], dict[str, str]], requested: float) -> None:
        try:
            self.files = write()
        except Exception as exc:  # noqa: BLE001 - handed to the loop, which stops every rank with it
            self.error = exc
        self.seconds = time.perf_counter() - requested

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
