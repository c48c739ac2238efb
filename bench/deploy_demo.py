"""The quick start's demo, timed: `bash deploy_8gpu.sh --demo` end to end on this machine.

    python bench/deploy_demo.py [--trainer forecast] [--out bench/results/deploy_demo_forecast_cpu.json]

Runs `bash deploy_8gpu.sh --trainer NAME --demo --foreground --out DIR` (a fresh DIR each time, so no
phase is skipped as done), times the whole command from outside, reads each phase's own time from
the deploy log (`<== [phase] done in N s`), and keeps the run's results.json (the trainer's
evaluation and the export's parity check) beside them, so the README's figures about the demo come
from one record.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
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
    p.add_argument("--trainer", default="forecast")
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="deploy-demo-") as tmp:
        out = Path(tmp) / "runs"
        command = ["bash", "deploy_8gpu.sh", "--trainer", args.trainer, "--demo", "--foreground", "--out", str(out)]
        load_start = os.getloadavg()
        t0 = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        load_end = os.getloadavg()
        log = (out / f"deploy-{args.trainer}.log").read_text() if (out / f"deploy-{args.trainer}.log").is_file() else ""
        results_file = out / args.trainer / "results.json"
        results = json.loads(results_file.read_text()) if results_file.is_file() else None
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"the demo failed (exit {done.returncode})")
    phases = {name: int(s) for name, s in re.findall(r"^<== \[([\w-]+)\] done in (\d+) s$", log, flags=re.M)}
    record = {"benchmark": "deploy_demo", "trainer": args.trainer,
              "deploy_command": " ".join(command[:-1] + ["<a fresh folder>"]),
              "wall_s": wall, "phases_s": phases,
              "load_average_1_5_15": {"start": list(load_start), "end": list(load_end)}, "results": results}
    record["git_changed_files"] = changed_files()
    write_record(record, args.out)
    print(f"{' '.join(command)}: {wall:.0f} s; phases (s): {phases}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
