"""Errors the user can fix. The CLI prints them as one line and exits non-zero."""


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
    line, exit 1, under torchrun too, so a script or scheduler chaining on torchrun's status sees the
    failure. torchrun restarts a failed worker group whatever its exit code, and a restart would end
    the same way while the pod bills: the ending is left in torchrun's own store
    (runtime.dist.remember_terminal_stop) and a restarted worker ends at once with it, before
    building anything (runtime.dist.distributed), until torchrun runs out of restarts."""

    exit_code = 1


def first_line(exc: BaseException) -> str:
    """The first line of an error's message for a one-line log, or its type's name when it has no message."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
