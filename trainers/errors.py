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
