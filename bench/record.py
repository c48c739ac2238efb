"""What every benchmark result carries, and how it is written."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers.runtime.info import git_commit, versions  # noqa: E402


def provenance() -> dict:
    """Machine, versions, git commit and the exact command of this benchmark run."""
    return {"machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
            "versions": versions(), "git_commit": git_commit(), "command": "python " + " ".join(sys.argv)}


def write_record(record: dict, out: str | None) -> None:
    record.update(provenance())
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(record, indent=2) + "\n")
