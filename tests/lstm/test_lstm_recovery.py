"""The worker's one recovery table (trainers.lstm.recovery, issue 61): every cell, as its docstring draws it. The
paths that act on it (a cohort's member retried alone, a stack's failure, a broken context) run in
test_lstm_cohort.py and test_lstm_faults.py."""

import pytest
import torch

from trainers.lstm.recovery import Recovery, Where, recovery

BROKEN = RuntimeError("CUDA error: an illegal memory access was encountered")
OUT_OF_MEMORY = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
OTHER = ValueError("a NaN in the bars")

TABLE = {  # (where, attempt): (broken context, stopping, out of memory, other)
    (Where.ALONE, 1): (Recovery.END_WORKER, Recovery.RESUME_LATER, Recovery.AGAIN, Recovery.AGAIN),
    (Where.ALONE, 2): (Recovery.END_WORKER, Recovery.RESUME_LATER, Recovery.RECORD_FAILED, Recovery.RECORD_FAILED),
    (Where.MEMBER, 1): (Recovery.END_WORKER, Recovery.RESUME_LATER, Recovery.ALONE, Recovery.AGAIN),
    (Where.STACK, 1): (Recovery.END_WORKER, Recovery.RESUME_LATER, Recovery.ALONE, Recovery.ALONE),
}


@pytest.mark.parametrize("where,attempt", TABLE)
def test_every_cell_of_the_table(where, attempt):
    broken, stopping, out_of_memory, other = TABLE[where, attempt]
    assert recovery(BROKEN, where, lambda: True, attempt=attempt) is broken  # (stopping or not: nothing runs here)
    assert recovery(OTHER, where, lambda: True, attempt=attempt) is stopping
    assert recovery(OUT_OF_MEMORY, where, lambda: False, attempt=attempt) is out_of_memory
    assert recovery(OTHER, where, lambda: False, attempt=attempt) is other


def test_the_stop_is_asked_only_past_a_broken_context():
    """Worker.stopping reads the job's stop record from its folder: not asked where the answer is END_WORKER."""
    asked = []

    def stopping() -> bool:
        asked.append(True)
        return False
    assert recovery(BROKEN, Where.MEMBER, stopping) is Recovery.END_WORKER and not asked
    assert recovery(OTHER, Where.MEMBER, stopping) is Recovery.AGAIN and asked
