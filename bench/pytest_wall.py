"""How long a part of the test suite takes on this machine, recorded like every other benchmark.

    python bench/pytest_wall.py --out bench/results/tests_leaks_cpu.json -- -q tests/leaks

Runs `python -m pytest ARGS` from the repository root, times it from outside, and keeps pytest's
own summary (counts by outcome and the seconds it reports), the load average before and after (the
development machine is shared: a loaded box stretches every figure) and, with `--durations N` among
the arguments, the slowest tests pytest lists.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402


def changed_files() -> list[str]:
    """Tracked files that differ from the recorded commit (a measurement of other code says so)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                         text=True)
    return [line[3:] for line in out.stdout.splitlines()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    p.add_argument("pytest_args", nargs="+", help="what to pass to pytest (after --)")
    args = p.parse_args()
    command = [sys.executable, "-m", "pytest", *args.pytest_args]
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    load_end = os.getloadavg()
    lines = done.stdout.strip().splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)), "")
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)",
                                                     summary)}
    reported = re.search(r"in ([\d.]+)s", summary)
    slowest = [{"seconds": float(s), "phase": phase, "test": test}
               for s, phase, test in re.findall(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$", done.stdout, flags=re.M)]
    record = {"benchmark": "pytest_wall", "pytest_command": "python -m pytest " + " ".join(args.pytest_args),
              "exit_code": done.returncode, "wall_s": wall, "pytest_reported_s": float(reported.group(1)) if reported else None,
              "summary": summary, "counts": counts, "slowest": slowest,
              "load_average_1_5_15": {"start": list(load_start), "end": list(load_end)}}
    record["git_changed_files"] = changed_files()
    write_record(record, args.out)
    print(f"{record['pytest_command']}: {wall:.0f} s, {summary} (exit {done.returncode})")
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
