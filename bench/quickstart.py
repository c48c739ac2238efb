"""The README's quick start as a newcomer runs it: a fresh clone, a new shell for each of its two commands (no venv
active, the environment of a login shell), each timed; the tests' JUnit report gives the per-tier times.

    python bench/quickstart.py --work /var/tmp/quickstart --out bench/results/quickstart_cpu.json

The commands are read from README.md's quick start, exactly as printed (the first two bash blocks), so the figures
the README gives for them are of what it prints. Exit 1 when either command fails; the record says which.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from record import write_record  # noqa: E402
from tier_times import tier_times  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands(readme: str) -> list[str]:
    quick = readme[readme.index("## Quick start"):readme.index("## Deploy on a GPU box")]
    return re.findall(r"```bash\n(.*?)\n```", quick, re.S)[:2]


def new_shell_env(home: Path) -> dict:
    """What a new login shell has: no venv, no PYTHONPATH, the system PATH (pip's cache kept: a newcomer's machine
    may have one, and this one's holds torch's CPU wheel, as CI's does)."""
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "TERM", "PIP_CONSTRAINT", "PIP_INDEX_URL", "PIP_FIND_LINKS",
                                      "XDG_CACHE_HOME") if k in os.environ}
    path = ":".join(p for p in os.environ.get("PATH", "").split(":") if "/.venv" not in p and "venv" not in p)
    return {**keep, "PATH": path or "/usr/local/bin:/usr/bin:/bin", "HOME": keep.get("HOME", str(home))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="an empty folder (or none) for the clone")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.work.exists() and any(args.work.iterdir()):
        p.error(f"--work {args.work} is not empty: the quick start is timed from a fresh clone")
    clone = args.work / "trainers"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = new_shell_env(args.work)
    steps = []
    junit = args.work / "junit.xml"
    for n, command in enumerate(quick_start_commands((ROOT / "README.md").read_text()), 1):
        step_env = dict(env, PYTEST_ADDOPTS=f"--junitxml={junit}") if n == 2 else env
        started = time.monotonic()
        proc = subprocess.run(["bash", "-c", command], cwd=clone, env=step_env, capture_output=True, text=True)
        steps.append({"command": command, "exit_code": proc.returncode, "wall_s": time.monotonic() - started,
                      "tail": (proc.stdout + proc.stderr)[-1500:]})
        print(f"command {n}: exit {proc.returncode} in {steps[-1]['wall_s']:.0f} s", flush=True)
        if proc.returncode != 0:
            break
    record = {"benchmark": "quickstart", "device": "cpu", "steps": steps,
              "passed": len(steps) == 2 and all(s["exit_code"] == 0 for s in steps)}
    if junit.exists():
        tiers = tier_times(junit)
        record["tests"] = {"tiers": tiers, "count": sum(t["tests"] for t in tiers.values()),
                           "failed": sum(t["failed"] for t in tiers.values()),
                           "test_time_s": sum(t["seconds"] for t in tiers.values())}
    write_record(record, args.out)
    shutil.rmtree(clone / ".venv", ignore_errors=True)  # (gigabytes; the record has what was measured)
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
