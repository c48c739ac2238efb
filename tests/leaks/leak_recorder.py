"""A pytest plugin for the leak tier (`-p leak_recorder`, importable through PYTHONPATH): records
how each test ended, and for a failure the exception's type and where it was raised, into the JSON
file named by $LEAK_REPORT. The tier reads it to tell "a test assertion caught the mutant" from "the
mutant crashed something" (an ImportError, a TypeError, an assert inside the package itself)."""

from __future__ import annotations

import json
import os
import sys

import pytest

_tests: dict[str, dict] = {}


def _exception(excinfo) -> dict:
    exc = excinfo.value
    entry = excinfo.traceback[-1] if excinfo.traceback else None
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "mro": [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__],
            "raised_in": str(entry.path) if entry is not None else None,
            "message": str(exc).splitlines()[0][:300] if str(exc) else ""}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    test = _tests.setdefault(item.nodeid, {"outcome": "passed", "phases": {}})
    phase = {"outcome": report.outcome}
    if call.excinfo is not None and not report.skipped:
        phase["exception"] = _exception(call.excinfo)
    test["phases"][call.when] = phase
    if report.failed:
        test["outcome"] = "failed"
    elif report.skipped and test["outcome"] == "passed":
        test["outcome"] = "skipped"


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("LEAK_REPORT")
    if not path:
        return
    trainers = sys.modules.get("trainers")
    if trainers is None:
        import trainers
    with open(path, "w") as f:
        json.dump({"exitstatus": int(exitstatus), "trainers_file": trainers.__file__, "tests": _tests}, f, indent=1)
