"""What every benchmark result carries, and how it is written: the device's name, the driver, torch, CUDA and
Python versions, the commit of the code that ran and whether its tree was dirty (with a hash of the tree as it
was), the command line and the time. The code's state is read when the benchmark starts (this module's import) and
again when it records: a result whose code changed in between is refused, never recorded under a commit it did not
run (the JSONs of one GPU session named a commit whose lstm/ differed by 252 lines from the code that ran)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers.runtime.info import KIT_ROOT, git_commit, versions  # noqa: E402

# what the tree hash covers where git cannot list the files (a copy without its .git, as a lent GPU gets)
SOURCES = ("trainers", "bench", "tools", "tests", "docker", "kit_lib.sh", "deploy_8gpu.sh", "run_multigpu.sh",
           "pyproject.toml")


def tracked_files(root: Path, commit: str | None) -> list[Path]:
    """The files the code is made of: git's tracked files where the kit is its own checkout (its `commit`, read
    once by source_state), else every file under SOURCES (caches, results and virtual environments left out)."""
    if commit is not None and (root / ".git").exists():
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, timeout=30)
        if out.returncode == 0:
            return [root / name for name in out.stdout.decode().split("\0") if name]
    files = []
    for name in SOURCES:
        path = root / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        files += [p for p in candidates if p.is_file() and "__pycache__" not in p.parts
                  and "results" not in p.relative_to(root).parts[:2]]
    return files


def source_state(root: Path = KIT_ROOT) -> dict:
    """The commit, whether the tree differs from it (None where there is no checkout), and the SHA-256 of the code
    as it is on disk (every tracked file's path and bytes; bench/results, which a benchmark writes, left out)."""
    commit = git_commit(root)
    dirty, untracked = None, []
    if commit is not None and (root / ".git").exists():
        # a new module not yet added runs as much as an edited one: untracked code files count (not results, which
        # a benchmark writes, nor what .gitignore keeps out)
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all", "--",
                              ".", ":(exclude)bench/results"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            lines = [line for line in out.stdout.splitlines() if line.strip()]
            untracked = [root / line[3:] for line in lines if line.startswith("??")
                         and line.endswith((".py", ".sh", ".toml", ".cfg"))]
            dirty = any(not line.startswith("??") for line in lines) or bool(untracked)
    digest = hashlib.sha256()
    for path in sorted(set(tracked_files(root, commit)) | set(untracked)):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("bench/results/") or not path.is_file():
            continue
        digest.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    source = "git" if commit is not None and (root / ".git").exists() else "TRAINERS_GIT_COMMIT" if commit else None
    return {"git_commit": commit, "git_commit_source": source, "git_dirty": dirty, "tree_sha256": digest.hexdigest()}


STARTED = source_state()  # the code this benchmark runs, read as it starts


class CodeChanged(RuntimeError):
    """The code changed between the benchmark's start and its record."""


def gpu_driver() -> str | None:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=20)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def device_name() -> str:
    """The accelerator the benchmark ran on: the first GPU nvidia-smi names, else the CPU's model."""
    import shutil

    exe = shutil.which("nvidia-smi")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")  # a run told to see no GPU runs on the CPU
    if exe is not None and not hidden:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def provenance(started: dict | None = None) -> dict:
    """Machine, device, driver, versions, the code's commit and state, and the exact command of this benchmark
    run. Refuses (CodeChanged) when the code is not what it was at the start: a result says the commit it ran."""
    import time

    started = STARTED if started is None else started
    now = source_state()
    if now != started:
        raise CodeChanged(f"the code changed while the benchmark ran (at its start {started}, now {now}): "
                          "nothing recorded; run it again on a tree that stays put")
    return {"machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "gpu_driver": gpu_driver()},
            "device_name": device_name(), "versions": versions(), **started,
            "command": "python " + " ".join(sys.argv),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_record(record: dict, out: str | None) -> None:
    try:
        record.update(provenance())
    except CodeChanged as exc:
        raise SystemExit(f"error: {exc}") from None
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(record, indent=2) + "\n")
