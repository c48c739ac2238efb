"""Benchmark: the LSTM job's exports behind the training (`--export-behind`) against the exports in the worker
(`--no-export-behind`) and against no export (`--no-export`): one job command three ways, one after another, as the
CLI runs it (torch on its default threads), in one run.

    python bench/lstm_export_behind.py --out bench/results/lstm_export_behind_cpu.json -- \\
        --synthetic-tickers 32 --epochs 1 --patience 0 --device cpu
    python bench/lstm_export_behind.py --out OUT/lstm_export_behind_gpu.json -- \\
        --synthetic-tickers 500 --epochs 5 --patience 0 --device auto          (a GPU session's)

Per way: the command's wall time (process start to exit), the job's own (results.json), the symbols finished and
exported, and the exporter processes' peak resident memory (sampled every 0.2 s; Linux). Then what the exports cost each way (its job wall less the --no-export job's), and whether both ways wrote
every symbol's model.onnx with the same bytes (they should: the same export, in another process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

WAYS = {"no_export": ["--no-export"], "in_worker": ["--no-export-behind"], "behind": ["--export-behind"]}


def exporters_peak_rss_mb(job_pid: int) -> float | None:
    """The largest peak resident memory (VmHWM) of the job's exporter processes alive now: those whose parent, or
    its parent (a torchrun worker's), is the job's process (Linux's /proc; None elsewhere or when none is)."""
    peaks = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"trainers.lstm.export_behind" not in cmdline.read_bytes():
                continue
        except OSError:  # (it ended meanwhile)
            continue
        fields = proc_status(int(cmdline.parent.name))
        if fields is None or "VmHWM" not in fields:  # (ended, or a zombie: no memory left)
            continue
        parent = int(fields["PPid"])
        grandparent = int((proc_status(parent) or {"PPid": "-1"})["PPid"])
        if job_pid in (parent, grandparent):
            peaks.append(int(fields["VmHWM"].split()[0]) / 1024)
    return max(peaks, default=None)


def proc_status(pid: int) -> dict[str, str] | None:
    """/proc/PID/status as {field: value}; None once the process has ended."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":" in line)
    except OSError:
        return None
    return fields if "PPid" in fields else None


def run_way(root: Path, way: str, job: list[str]) -> dict:
    run_dir = root / way
    t0 = time.perf_counter()
    with open(root / f"{way}.stderr", "w+") as stderr:  # (a file: a pipe left unread while polling would fill)
        proc = subprocess.Popen([sys.executable, "-m", "trainers", "lstm", "train", *job, *WAYS[way], "--run-dir",
                                 str(run_dir)], stdout=subprocess.DEVNULL, stderr=stderr)
        peak_rss_mb = None
        while True:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                seen = exporters_peak_rss_mb(proc.pid)
                peak_rss_mb = max(peak_rss_mb or 0.0, seen) if seen is not None else peak_rss_mb
        wall = time.perf_counter() - t0
        stderr.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"lstm_export_behind: the {way} job failed (exit {proc.returncode}):\n"
                             f"{stderr.read()[-3000:]}")
    results = json.loads((run_dir / "results.json").read_text())
    rows = results["symbols"]
    return {"way": way, "flags": WAYS[way], "command_wall_s": wall,
            "job_wall_s": results["training"]["wall_time_s_this_attempt"],
            "symbols_ok": results["training"]["symbols"]["ok"],
            "exported": sum(1 for row in rows.values() if row.get("export")),
            "export_errors": sum(1 for row in rows.values() if row.get("export_error")),
            "exporter_peak_rss_mb": peak_rss_mb,
            "onnx_sha256": {s: row["export"]["sha256"] for s, row in rows.items() if row.get("export")}}


def summarise(job: list[str], rows: dict[str, dict]) -> dict:
    record = {"benchmark": "lstm_export_behind", "job": job, "complete": len(rows) == len(WAYS),
              "ways": [{k: v for k, v in row.items() if k != "onnx_sha256"} for row in rows.values()]}
    if not record["complete"]:
        return record
    base = rows["no_export"]["job_wall_s"]
    return {**record, "export_cost_s": {way: rows[way]["job_wall_s"] - base for way in ("in_worker", "behind")},
            "job_wall_ratio_behind_over_in_worker": rows["behind"]["job_wall_s"] / rows["in_worker"]["job_wall_s"],
            "same_onnx_bytes": rows["behind"]["onnx_sha256"] == rows["in_worker"]["onnx_sha256"]
            and len(rows["behind"]["onnx_sha256"]) == rows["in_worker"]["symbols_ok"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("job", nargs=argparse.REMAINDER, help="-- then the `trainers lstm train` options of the job")
    args = p.parse_args(argv)
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job:
        p.error("give the job's options after --, e.g. -- --synthetic-tickers 32 --epochs 1 --device cpu")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way in WAYS:  # the record so far after each way: a cut run (a device call's limit) keeps what finished
            rows[way] = run_way(Path(tmp), way, job)
            record = summarise(job, rows)
            write_record(record, args.out)
    print(json.dumps({k: v for k, v in record.items() if k not in ("machine", "versions")}, indent=1))
    return 0 if record["same_onnx_bytes"] else 1


if __name__ == "__main__":
    sys.exit(main())
