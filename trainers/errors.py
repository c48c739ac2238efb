"""Errors the user can fix. The CLI prints them as one line and exits non-zero."""

import os


class UsageError(Exception):
    """Bad input: a value the user gave (or the data they pointed at) cannot be used.

    The message names the bad value and what would be accepted; it is printed as a single
    line, without a traceback, and the process exits with code 2.
    """

    exit_code = 2


class CheckFailed(Exception):
    """A check the kit runs on its own output failed (e.g. ONNX differs from PyTorch). One line, exit 1."""

    exit_code = 1


class CheckPassed(Exception):
    """`TRAINERS_CHECK_ONLY=1`: everything a run checks before its first write passed; nothing written."""

    exit_code = 0


class RunFailed(Exception):
    """The run cannot go on for a reason outside the code (a checkpoint write failed: disk full, a
    lost mount). Every rank raises it together; one line, exit 1; what is on disk is kept."""

    exit_code = 1


class RunEnded(Exception):
    """Training ended for good without success — the loss or a metric became non-finite, or the
    disk filled up — agreed by every rank after results.json recorded why (`stop_reason`). One
    line. The exit code is 1 as a plain command, 0 under torchrun: torchrun restarts a failed
    worker group whatever its exit code, and a restart would end the same way (the same arithmetic
    diverges again, the disk is still full) while the pod bills. The deploy reads results.json and
    fails its train phase with the reason."""

    @property
    def exit_code(self) -> int:
        return 0 if "TORCHELASTIC_RUN_ID" in os.environ else 1
