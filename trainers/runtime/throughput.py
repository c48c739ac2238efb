"""How fast a run trains: the steady rate, the job's effective rate, MFU and where the time went.

Steps are timed in windows between log points. The first window holds compilation and warm-up and
is reported apart; the others make the steady rate. A window's edges are synchronised with the
device (on a GPU the queued kernels are done, so the time is honest), and time spent inside a
window on evaluation or checkpoints is taken out of it and reported under its own phase. Beside
the steady rate: the effective rate (everything trained this attempt / the process's wall time),
which is what the user pays for, and the breakdown that explains the difference.
"""

from __future__ import annotations

import contextlib
import time

import torch

from trainers.runtime import device as device_mod
from trainers.runtime.flops import peak_tflops
from trainers.runtime.info import device_name, peak_memory_bytes


class ThroughputClock:
    def __init__(self, unit: str, device: torch.device, world_size: int, flops_per_item: float | None,
                 started_at: float):
        self.unit = unit
        self.device = device
        self.world_size = world_size
        self.flops_per_item = flops_per_item
        self.started_at = started_at  # the process start (time.time()): the effective rate's clock
        self.entered_at = started_at  # when the run boundary was entered: start-up ends there
        self.phases = {"evaluation": 0.0, "checkpoint": 0.0}
        self.slowest = {"evaluation": 0.0, "checkpoint": 0.0}  # the longest single stretch of each
        self.items_this_attempt = 0
        self.steady_items = 0
        self.steady_s = 0.0
        self.steady_steps = 0
        self.first_window_s: float | None = None
        self.windows_closed = 0
        self._window_start = time.perf_counter()
        self._window_items = 0
        self._window_steps = 0
        self._excluded = 0.0

    def start(self) -> None:
        """The loop begins (after resume): the first window starts now."""
        self._window_start = time.perf_counter()

    def count(self, items: int) -> None:
        """One optimizer step that trained `items` (all ranks together)."""
        self._window_items += items
        self._window_steps += 1
        self.items_this_attempt += items

    def exclude(self, phase: str, seconds: float) -> None:
        """Time the loop spent on `phase` (evaluation, checkpoint): not step time."""
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds
        self.slowest[phase] = max(self.slowest.get(phase, 0.0), seconds)
        self._excluded += seconds

    @contextlib.contextmanager
    def timing(self, phase: str, after=None):
        """Time spent inside is `phase`'s, not step time; `after()` runs when it ends. Both edges wait for
        the device: the steps' queued kernels finish before the phase's clock starts (on a GPU they would
        otherwise be billed to the phase), the phase's own before it stops."""
        device_mod.synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            device_mod.synchronize(self.device)
            self.exclude(phase, time.perf_counter() - t0)
            if after is not None:
                after()

    def close_window(self) -> dict:
        """End the window at this step: its rate, step time, peak memory and MFU (for the metrics)."""
        device_mod.synchronize(self.device)  # the window's kernels are done: honest time
        now = time.perf_counter()
        seconds = max(now - self._window_start - self._excluded, 1e-9)
        if self.windows_closed == 0:
            self.first_window_s = seconds  # compile and warm-up: not steady state
        else:
            self.steady_items += self._window_items
            self.steady_s += seconds
            self.steady_steps += self._window_steps
        self.windows_closed += 1
        per_s = self._window_items / seconds
        values = {f"{self.unit}_per_s": per_s, f"{self.unit}_per_s_per_device": per_s / self.world_size,
                  "step_time_s": seconds / max(self._window_steps, 1), "peak_memory_bytes": peak_memory_bytes(self.device)}
        mfu = self.mfu(per_s)
        if mfu is not None:
            values["mfu"] = mfu
        self._window_start, self._window_items, self._window_steps, self._excluded = now, 0, 0, 0.0
        return values

    def seconds_per_step(self) -> float | None:
        """The steady step time so far (None before the first steady window)."""
        return self.steady_s / self.steady_steps if self.steady_steps and self.steady_s > 0 else None

    def mfu(self, per_s: float | None) -> float | None:
        peak = peak_tflops(device_name(self.device)) if self.device.type == "cuda" else None
        if per_s is None or peak is None or not self.flops_per_item:
            return None
        return per_s * self.flops_per_item / (peak * 1e12 * self.world_size)

    def summary(self, writes_behind_s: float = 0.0) -> dict:
        """results.json's `throughput`: steady and effective rates, and the wall time's breakdown."""
        wall = max(time.time() - self.started_at, 1e-9)
        steady = self.steady_items / self.steady_s if self.steady_s > 0 else None
        note = "only the warm-up window was measured" if steady is None and self.first_window_s else None
        startup = self.entered_at - self.started_at
        accounted = (self.first_window_s or 0.0) + self.steady_s + sum(self.phases.values())
        return {"unit": self.unit, "per_s_steady": steady,
                "per_s_per_device": steady / self.world_size if steady else None,
                "effective_per_s": self.items_this_attempt / wall, "items_this_attempt": self.items_this_attempt,
                "steady_steps": self.steady_steps, "note": note,
                "checkpoint_writes_behind_s": writes_behind_s,  # overlapped with training (--ckpt-async)
                "breakdown_s": {"startup": startup, "first_window": self.first_window_s,
                                "steady_steps": self.steady_s, **self.phases,
                                "other": max(wall - accounted - startup, 0.0), "wall": wall}}
