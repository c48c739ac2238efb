"""What every benchmark result carries, and how it is written."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers.runtime.info import git_commit, versions  # noqa: E402


def gpu_driver() -> str | None:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=20)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def provenance() -> dict:
    """Machine, driver, versions, git commit and the exact command of this benchmark run."""
    import time

    return {"machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "gpu_driver": gpu_driver()},
            "versions": versions(), "git_commit": git_commit(), "command": "python " + " ".join(sys.argv),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_record(record: dict, out: str | None) -> None:
    record.update(provenance())
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(record, indent=2) + "\n")
