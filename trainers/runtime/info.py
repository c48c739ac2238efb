"""Facts recorded with every result: git commit, versions, memory."""

from __future__ import annotations

import platform
import resource
import subprocess
import sys
from pathlib import Path

import torch


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "platform": sys.platform}


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated GPU memory on CUDA; peak resident set size of this process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"
