"""Facts recorded with every result: git commit, versions, memory."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from trainers.runtime import device as device_mod
from trainers.runtime.dist import DistContext, all_gather_object

KIT_ROOT = Path(__file__).resolve().parents[2]  # the folder holding trainers/, bench/, deploy_8gpu.sh


def git_commit(root: Path = KIT_ROOT) -> str | None:
    """The kit's commit: only when the kit's own folder is the top of a git work tree. A copy without its
    .git inside another repository (the first GPU run's tree was one) records none, not that repository's
    commit. In our image (no .git): the commit it was built from (TRAINERS_GIT_COMMIT)."""
    fallback = os.environ.get("TRAINERS_GIT_COMMIT") or None
    if not (root / ".git").exists():
        return fallback
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return fallback
    lines = out.stdout.split("\n")
    if out.returncode != 0 or len(lines) < 2 or Path(lines[0]).resolve() != root.resolve():
        return fallback
    return lines[1].strip() or fallback


@functools.lru_cache(maxsize=1)
def kit_commit() -> str | None:
    """git_commit() once per process, for every result it records: the code it runs was read at its start
    (and a job of 500 symbols asked git 500 times, ~4 ms each)."""
    return git_commit()


def versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "platform": sys.platform}


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated GPU memory on CUDA; peak resident set size of this process on CPU."""
    return device_mod.peak_memory(device)


def device_name(device: torch.device) -> str:
    return device_mod.name(device)


def run_facts(ctx: DistContext, elapsed_s: float, cost_usd: float | None) -> dict:
    """What every trainer's results.json records about where and how long it ran. Collective: the
    peak memory is the largest over all ranks."""
    peak = max(int(v) for v in all_gather_object(ctx, peak_memory_bytes(ctx.device)))
    return {"elapsed_s_all_attempts": elapsed_s, "device_hours": elapsed_s / 3600.0 * ctx.world_size,
            "cost_usd": cost_usd, "peak_memory_bytes": peak, "world_size": ctx.world_size,
            "device": ctx.device.type, "device_name": device_name(ctx.device), "restarts": ctx.restart_count}
