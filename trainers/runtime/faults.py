"""Fault injection for the fault-tolerance tests (never set outside tests):

    TRAINERS_FAULT=sigkill@rank1:step25                     a rank signals itself at an optimizer step (sigterm, sighup)
    TRAINERS_FAULT_RAISE=SYN001@step2:always,SYN002@step2:once   a named piece of work raises
    TRAINERS_FAULT_RAISE=SYN001@step2:lost                  ... a CUDA error that breaks the process's device
    TRAINERS_FAULT_RAISE=worker1@step2:lost                 ... in whatever worker 1 trains (`as_worker`)
    TRAINERS_FAULT_MEMORY=2                                 a stacked pass of more than 2 models is out of memory

`TRAINERS_FAULT`: the named rank sends the signal to itself when it reaches that optimizer step, on
the first attempt only (TORCHELASTIC_RESTART_COUNT=0), so a restarted job runs through. It exercises
the real paths: SIGKILL gives no chance to clean up, SIGTERM and SIGHUP go through the signal handlers. The
run boundary calls `maybe_inject` at every step with its context's rank.

Which rank. A process that runs single-process runs of its own (the LSTM: each torchrun worker
trains symbols one after another, each in a run whose context is rank 0) says which worker it is
with `as_worker(rank)`, once, around its work; `maybe_inject` then matches that rank instead of the
run's, so the fault fires in the one worker it names and not in every one.

`TRAINERS_FAULT_RAISE`: a piece of work with a name (an LSTM symbol) raises RuntimeError at the
given step: `always` on every try, `once` on the first try only (so a retry succeeds). It
exercises a trainer's handling of one failing unit among many. The loop that owns the work calls
`maybe_raise(name, step, attempt)`; `raise_requests()` parses the variable (a malformed one is a
ValueError, so a typo in a test fails loudly instead of testing nothing). The name `workerN` stands for any
work of the process that declared itself worker N (`as_worker`). `lost`: on a CPU the error is the one CUDA
raises after a kernel fault (an illegal memory access), and, as on a GPU, it is sticky: from then on every
`maybe_raise` and every stacked pass (`before_stacked_pass`) in this process raises it too, whatever the work.
It fires on torchrun's first attempt only (TORCHELASTIC_RESTART_COUNT=0), so a restarted worker, with a fresh
context, runs through; without torchrun on every run (a test runs the job again without it to resume);
`as_worker` forgets it as it ends. On a CUDA device it is the real thing: an index out of bounds in a kernel,
whose device-side assert breaks the process's context as any kernel fault does, in CUDA's words ("device-side
assert triggered"; what bench/gpu_session.sh checks on a lent GPU, with torchrun's restart).

`TRAINERS_FAULT_MEMORY=N`: a pass of an LSTM cohort's stacked models (training step or evaluation) over more
than N models raises torch.OutOfMemoryError, as CUDA's allocator would on a card too small for the cohort
(0: not even one model fits). The cohort calls `before_stacked_pass(models)` before each stacked pass.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator

_SPEC = re.compile(r"^(sigkill|sigterm|sighup)@rank(\d+):step(\d+)$")
_RAISE = re.compile(r"^([^@,\s]+)@step(\d+):(always|once|lost)$")
RAISE_ENV = "TRAINERS_FAULT_RAISE"
MEMORY_ENV = "TRAINERS_FAULT_MEMORY"

_worker_rank: int | None = None  # set by `as_worker`: this process's rank for TRAINERS_FAULT
_device_lost: str | None = None  # a `lost` fault fired: every later device call of this process raises this


@contextlib.contextmanager
def as_worker(rank: int) -> Iterator[None]:
    """Inside, `maybe_inject` takes this process to be worker `rank`, whatever rank its runs have."""
    global _worker_rank, _device_lost
    previous, _worker_rank = _worker_rank, rank
    try:
        yield
    finally:
        _worker_rank = previous  # an in-process caller (tests) runs the next job as itself again
        _device_lost = None  # ... on a device of its own, as a new process would


def maybe_inject(rank: int, step: int, restart_count: int) -> None:
    spec = os.environ.get("TRAINERS_FAULT")
    if not spec or restart_count > 0:
        return
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"TRAINERS_FAULT={spec!r} is not like sigkill@rank1:step25")
    kind, fault_rank, fault_step = m.group(1), int(m.group(2)), int(m.group(3))
    me = _worker_rank if _worker_rank is not None else rank
    if me == fault_rank and step == fault_step:
        os.kill(os.getpid(), {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sighup": signal.SIGHUP}[kind])


def raise_requests() -> dict[str, tuple[int, str]]:
    """{name: (step, 'always' | 'once')} from TRAINERS_FAULT_RAISE (empty when unset)."""
    spec = os.environ.get(RAISE_ENV, "")
    memory_limit()  # (a malformed TRAINERS_FAULT_MEMORY fails here too, before any work)
    out = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        m = _RAISE.match(part)
        if m is None:
            raise ValueError(f"{RAISE_ENV}={spec!r}: {part!r} is not like SYN001@step2:always, SYN002@step2:once "
                             f"or SYN003@step2:lost")
        out[m.group(1)] = (int(m.group(2)), m.group(3))
    return out


def maybe_raise(name: str, step: int, attempt: int, device=None) -> None:
    """Raise if TRAINERS_FAULT_RAISE asks `name` to fail at `step` on this try (1, 2, ...), or this process's
    device was lost before. (`device`: the work's; on CUDA a `lost` fault is a real kernel fault.)"""
    global _device_lost
    _raise_if_device_lost()
    requests = raise_requests()
    want = requests.get(name) or requests.get(f"worker{_worker_rank}")
    if want is None or step != want[0]:
        return
    if want[1] == "lost":
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            if device is not None and device.type == "cuda":
                import torch

                one = torch.zeros(1, device=device)
                one[torch.ones(1, dtype=torch.long, device=device)].sum().item()  # index 1 of 1: a device-side assert
            _device_lost = f"{RAISE_ENV} asked {name}'s device to fail at step {step}"
            _raise_if_device_lost()
    elif want[1] == "always" or attempt == 1:
        raise RuntimeError(f"{RAISE_ENV} asked {name} to fail at step {step} (try {attempt})")


def _raise_if_device_lost() -> None:
    if _device_lost is not None:
        import torch

        # CUDA's words after a kernel fault (torch raises them as AcceleratorError, a RuntimeError)
        # (torch.AcceleratorError is 2.8's; before it CUDA's errors were plain RuntimeErrors, as it still is one)
        error = torch.AcceleratorError if hasattr(torch, "AcceleratorError") else RuntimeError
        raise error(f"CUDA error: an illegal memory access was encountered ({_device_lost})")


def memory_limit() -> int | None:
    """The most models a stacked pass may hold under TRAINERS_FAULT_MEMORY (None when unset)."""
    spec = os.environ.get(MEMORY_ENV, "")
    if not spec:
        return None
    if not spec.isdigit():
        raise ValueError(f"{MEMORY_ENV}={spec!r} is not a number of models (0 or more)")
    return int(spec)


def before_stacked_pass(models: int) -> None:
    """Raise what a stacked pass of `models` models meets under test: this process's lost device (a `lost`
    fault fired before), or torch.OutOfMemoryError if TRAINERS_FAULT_MEMORY says they do not fit."""
    _raise_if_device_lost()
    limit = memory_limit()
    if limit is not None and models > limit:
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory ({MEMORY_ENV}={limit}: a pass of {models} models "
                                     f"does not fit)")
