"""Benchmark: what one durable small write costs on a machine's disk, the unit of a run's bookkeeping.

Each symbol of an LSTM job writes about 15 small files through `runtime.files.atomic_write` (a temp file,
its fsync, the rename, the folder's fsync): its run folder, heartbeats, checkpoints, results. On this
development VM one such write takes under a millisecond; on a cloud GPU host's disk (network block
storage, overlay filesystems) an fsync can take several, which would make a 500-symbol job's bookkeeping
a large share of its wall time (the first H100 measured ~0.23 s a symbol outside the steps, unexplained).
This times, in the folder given (the run folder's filesystem):

  durable      atomic_write_json of a small record (what the kit does)
  no_fsync     the same temp file and rename without either fsync (what durability costs)

    python bench/disk_write.py --dir /workspace/probe --writes 200 --out bench/results/disk_write_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.runtime.files import atomic_write_json  # noqa: E402

RECORD = {"step": 123, "elapsed_s": 45.6, "world_size": 1, "note": "x" * 300}  # a heartbeat-sized record


def no_fsync_write(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def time_writes(folder: Path, write, writes: int) -> dict:
    seconds = []
    for i in range(writes):
        t0 = time.perf_counter()
        write(folder / f"record{i % 8}.json", RECORD)  # a few files rewritten, as a run's bookkeeping does
        seconds.append(time.perf_counter() - t0)
    ms = sorted(s * 1e3 for s in seconds)
    return {"writes": writes, "median_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))],
            "mean_ms": statistics.fmean(ms), "max_ms": ms[-1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None, help="an existing folder on the filesystem to measure (default: the temp folder)")
    ap.add_argument("--writes", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.writes < 1:
        print(f"error: --writes {args.writes} must be >= 1", file=sys.stderr)
        return 2
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    if not base.is_dir():
        print(f"error: --dir {base} is not an existing folder; give the folder whose filesystem to measure",
              file=sys.stderr)
        return 2
    try:
        folder = Path(tempfile.mkdtemp(prefix="disk_write.", dir=base))  # its own: nothing of the user's is touched
    except OSError as exc:
        print(f"error: --dir {base}: cannot write there ({exc.strerror or exc}); give a writable folder", file=sys.stderr)
        return 2
    try:
        rows = {"durable": time_writes(folder, atomic_write_json, args.writes),
                "no_fsync": time_writes(folder, no_fsync_write, args.writes)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    record = {"benchmark": "disk_write", "folder": str(base.resolve()), "record_bytes": len(json.dumps(RECORD)),
              **rows, "fsync_cost_ms": rows["durable"]["median_ms"] - rows["no_fsync"]["median_ms"]}
    write_record(record, args.out)
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
