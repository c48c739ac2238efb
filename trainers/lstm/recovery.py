"""What the job does with a try that failed: one table, read by the worker wherever a try can fail.

    where it failed      the CUDA context broke   the job was stopping   out of device memory   any other error
    a symbol alone       END_WORKER               RESUME_LATER           by its try: AGAIN, then RECORD_FAILED
    a cohort's member    END_WORKER               RESUME_LATER           ALONE                  AGAIN
    a cohort's stack     END_WORKER               RESUME_LATER           ALONE                  ALONE

A broken context fails every later call in the process (runtime.device.context_lost), so nothing is retried in
it. A stop's error (a closed pipe with the SIGTERM) is not the symbol's fault. A member out of memory ran out as
the cohort's (its passes were halved first: Worker.smaller_cohorts), and a stack's own error is the stacked code's
(Worker.one_at_a_time), not the symbols': each is tried alone on a first try of its own. A member's own error, or
a symbol's alone, gets a second try from its last checkpoint, alone; a second failure is recorded.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from trainers.runtime import device as device_mod


class Recovery(enum.Enum):
    END_WORKER = "the worker ends (DeviceLost); torchrun restarts it on a fresh context"
    RESUME_LATER = "not counted as a failure; a new run resumes it"
    ALONE = "tried alone, on a first try of its own"
    AGAIN = "tried a second time alone, from its last checkpoint"
    RECORD_FAILED = "recorded failed; the other symbols go on"


class Where(enum.Enum):
    ALONE = "a symbol alone"
    MEMBER = "a cohort's member"
    STACK = "a cohort's stack"


def recovery(error: BaseException, where: Where, stopping: Callable[[], bool], device: torch.device | None = None,
             attempt: int = 1) -> Recovery:
    """The table's row `where`, the column `error` falls in (`stopping()`: whether the job is, asked only past a
    broken context; `attempt`: a symbol alone's try, 1 or 2)."""
    if device_mod.context_lost(error, device):
        return Recovery.END_WORKER
    if stopping():
        return Recovery.RESUME_LATER
    if where is Where.STACK or (where is Where.MEMBER and device_mod.out_of_memory(error)):
        return Recovery.ALONE
    if where is Where.MEMBER or attempt == 1:
        return Recovery.AGAIN
    return Recovery.RECORD_FAILED
