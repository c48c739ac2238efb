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
