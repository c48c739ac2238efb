"""Where a whole `trainers` command's host time goes, function by function: cProfile over the CLI, run in
this process (the `trainers` entry point leaves without the interpreter's teardown, which would lose the
profile).

    python bench/profile_job.py --out bench/results/profile_lstm_cohort_cpu.json -- \
        lstm train --synthetic-tickers 64 --epochs 2 --no-export --patience 0 --cohort 64 --run-dir /tmp/job

On a GPU a host wait (a `.cpu()`, an `.item()`, a save's copy) shows as time in the call that waits: what a
launch-bound job such as the LSTM's 500 symbols spends per symbol outside its training steps (about 0.2 s a
symbol on the first H100, unexplained). Writes the top functions by cumulative and by own time as JSON, with
the machine and the command; prints the cumulative table.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.cli import main as trainers_main  # noqa: E402

ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def rows(stats: pstats.Stats, key: str, top: int) -> list[dict]:
    """The `top` functions by `key` ("cumulative" or "own"): calls, own and cumulative seconds."""
    entries = []
    for (filename, line, name), (_primitive, calls, own, cumulative, _callers) in stats.stats.items():
        where = filename.replace(ROOT, "") if filename.startswith(ROOT) else filename.split("site-packages/")[-1]
        entries.append({"function": f"{where}:{line}({name})", "calls": calls, "own_s": own,
                        "cumulative_s": cumulative})
    field = "cumulative_s" if key == "cumulative" else "own_s"
    return sorted(entries, key=lambda e: -e[field])[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--top", type=int, default=60, help="functions kept in each table (default 60)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainers command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the trainers command after --, e.g. -- lstm train --synthetic-tickers 64")
    if args.top < 1:
        parser.error(f"--top {args.top}: give at least 1")
    profile = cProfile.Profile()
    started = time.perf_counter()
    code = profile.runcall(trainers_main, command)
    wall = time.perf_counter() - started
    stats = pstats.Stats(profile)
    record = {"benchmark": "profile_job", "job": command, "exit_code": code, "wall_s_profiled": wall,
              "by_cumulative": rows(stats, "cumulative", args.top), "by_own": rows(stats, "own", args.top)}
    write_record(record, args.out)
    for e in record["by_cumulative"][:args.top]:
        print(f"{e['cumulative_s']:9.3f} s {e['own_s']:9.3f} s {e['calls']:8d}  {e['function']}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
