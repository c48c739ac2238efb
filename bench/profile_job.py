"""Where a whole `trainers` command's host time goes, function by function: cProfile over the CLI, run in
this process (the `trainers` entry point leaves without the interpreter's teardown, which would lose the
profile).

    python bench/profile_job.py --out bench/results/profile_lstm_cohort_cpu.json -- \
        lstm train --synthetic-tickers 64 --epochs 2 --no-export --patience 0 --cohort 64 --run-dir /tmp/job

On a GPU a host wait (a `.cpu()`, an `.item()`, a save's copy) shows as time in the call that waits: what a
launch-bound job such as the LSTM's 500 symbols spends per symbol outside its training steps (about 0.2 s a
symbol on the first H100, unexplained). Writes the top functions by cumulative and by own time as JSON, with
the machine and the command; prints the cumulative table.

`--ops`: torch.profiler over the command instead (the host and, where CUDA is there, the device): the top
operations (aten ops and the regions torch labels) by their own device time and by their own host time, with
their calls. What PPO's update at 1,024 environments spends its 0.8 s on (79,401 env steps/s on the first H100,
100,000 asked): kernels or launches, the LSTMs or the environments. Keep the job short (a few steps): every
event is held in memory.

    python bench/profile_job.py --ops --out /tmp/ppo_ops.json -- ppo train --num-envs 1024 --batch-size 8192 \
        --total-steps 196608 --no-baseline-mlp --eval-every 1000 --run-dir /tmp/ppo_ops
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


def op_rows(averages, key: str, top: int) -> list[dict]:
    """The `top` operations by their own `key` time ("device" or "host"), each with its calls, own seconds on
    the host and the device, and its share of that total."""
    field = "self_device_time_total" if key == "device" else "self_cpu_time_total"
    total = sum(getattr(e, field, 0) for e in averages) or 1
    ranked = sorted(averages, key=lambda e: -getattr(e, field, 0))[:top]
    return [{"op": e.key, "calls": e.count, "host_s": e.self_cpu_time_total / 1e6,
             "device_s": getattr(e, "self_device_time_total", 0) / 1e6, "share": getattr(e, field, 0) / total}
            for e in ranked if getattr(e, field, 0) > 0]


def profile_ops(command: list[str], top: int) -> tuple[int, dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    device = torch.cuda.is_available()  # (asked once: the answer decides what is recorded and what is read)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device else [])
    with profile(activities=activities) as prof:
        code = trainers_main(command)
    averages = prof.key_averages()
    return code, {"activities": [a.name for a in activities],
                  "host_s": sum(e.self_cpu_time_total for e in averages) / 1e6,
                  "device_s": sum(getattr(e, "self_device_time_total", 0) for e in averages) / 1e6 if device else None,
                  "ops_dispatched": sum(e.count for e in averages if e.key.startswith("aten::")),
                  "by_device_time": op_rows(averages, "device", top) if device else [],
                  "by_host_time": op_rows(averages, "host", top)}


def threads_profiled(version: tuple[int, int] = sys.version_info[:2]) -> str:
    """Which threads' calls a cProfile table holds: from Python 3.12 cProfile listens through sys.monitoring,
    which reports every thread's calls into the one profile (the H200's cohort profile, Python 3.12.3, summed the
    checkpoint threads' times with the loop's: own times above the wall, a cumulative below its own time);
    before, only the thread that enabled it."""
    if version >= (3, 12):
        return ("all threads, in one table: a function's times add up across threads (they can exceed the wall), "
                "and a call's cumulative time can read less than its own time")
    return "the main thread only (threads it starts, such as checkpoint writers, are not counted)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--top", type=int, default=60, help="functions kept in each table (default 60)")
    parser.add_argument("--ops", action="store_true", help="torch.profiler's operations (host and device time) "
                                                           "instead of cProfile's functions")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainers command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the trainers command after --, e.g. -- lstm train --synthetic-tickers 64")
    if args.top < 1:
        parser.error(f"--top {args.top}: give at least 1")
    started = time.perf_counter()
    if args.ops:
        code, ops = profile_ops(command, args.top)
        record = {"benchmark": "profile_job_ops", "job": command, "exit_code": code,
                  "wall_s_profiled": time.perf_counter() - started, **ops}
        write_record(record, args.out)
        for e in record["by_device_time"] or record["by_host_time"]:
            print(f"{e['device_s']:9.3f} s device {e['host_s']:9.3f} s host {e['calls']:8d}  {e['op']}")
        return 0 if code == 0 else 1
    profile = cProfile.Profile()
    code = profile.runcall(trainers_main, command)
    wall = time.perf_counter() - started
    stats = pstats.Stats(profile)
    record = {"benchmark": "profile_job", "job": command, "exit_code": code, "wall_s_profiled": wall,
              "threads": threads_profiled(), "by_cumulative": rows(stats, "cumulative", args.top),
              "by_own": rows(stats, "own", args.top)}
    write_record(record, args.out)
    for e in record["by_cumulative"][:args.top]:
        print(f"{e['cumulative_s']:9.3f} s {e['own_s']:9.3f} s {e['calls']:8d}  {e['function']}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
