"""Fault injection for the fault-tolerance tests: `TRAINERS_FAULT=sigkill@rank1:step25`.

The named rank sends the signal to itself when it reaches that optimizer step, on the first
attempt only (TORCHELASTIC_RESTART_COUNT=0), so a restarted job runs through. It exercises the
real paths: SIGKILL gives no chance to clean up, SIGTERM goes through the signal handler.
"""

from __future__ import annotations

import os
import re
import signal

_SPEC = re.compile(r"^(sigkill|sigterm)@rank(\d+):step(\d+)$")


def maybe_inject(rank: int, step: int, restart_count: int) -> None:
    spec = os.environ.get("TRAINERS_FAULT")
    if not spec or restart_count > 0:
        return
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"TRAINERS_FAULT={spec!r} is not like sigkill@rank1:step25")
    kind, fault_rank, fault_step = m.group(1), int(m.group(2)), int(m.group(3))
    if rank == fault_rank and step == fault_step:
        os.kill(os.getpid(), signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)
