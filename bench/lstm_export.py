"""Benchmark: the LSTM job's per-symbol ONNX exports, one torch.onnx.export a process and the graph reused for
every later symbol with its own weights (trainers.onnx.export_reusing), against torch.onnx.export for every
symbol (what the job did before), on one trained job, in one run.

    python bench/lstm_export.py --symbols 64 --out bench/results/lstm_export_cpu.json
    python bench/lstm_export.py --symbols 32 --shape default --out bench/results/lstm_export_default_cpu.json

1. The job of N synthetic symbols (the small shape of bench/lstm_pack.py, one cohort of N; or the trainer's default
   model, one epoch, the CPU's default of one symbol at a time) trained with --no-export, and the same job with its export on (the default): the wall time a user waits for each.
2. On the first job's trained symbols, in this process: export_symbol (torch.onnx.export or the reused graph,
   then onnxruntime's parity check and the CPU latency, then its records) for every symbol, first as the job now
   does it (a reused graph takes the latency measured on the first symbol's file), then with the graph cache
   emptied before each symbol (an export and a latency measurement each, as before).
   Per symbol: the export's own seconds (export_s) and the whole export_symbol. One export before both warms
   torch.onnx up (the process's first export takes about twice as long), so neither row pays for it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lstm_pack import SHRUNK, run_job  # noqa: E402
from record import write_record  # noqa: E402

DEFAULT_MODEL = ["--patience", "0", "--epochs", "1", "--device", "cpu"]


def job_wall(root: Path, n: int, export: bool, job: list[str]) -> dict:
    """The job trained in a process of its own (lstm_pack.run_job: one worker, one thread), its exports counted."""
    shape = [a for a in job if a != "--no-export"] + ([] if export else ["--no-export"])
    label = "exported" if export else "trained"
    row = run_job(n, 1, 1, root, label, (), tuple(shape))
    exports = [json.loads(p.read_text()) for p in sorted((root / f"{label}-{n}").glob("symbols/*/export.json"))]
    return {"export": export, "command_wall_s": row["command_wall_s"], "job_wall_s": row["job_wall_s"],
            "exports": len(exports), "graphs": {g: sum(e["graph"] == g for e in exports) for g in ("exported", "reused")}}


def export_all(folders: list[Path], reuse: bool) -> dict:
    import trainers.lstm.export as lstm_export
    import trainers.onnx as onnx_mod

    lstm_export.forget_exports()
    export_s, whole_s, graphs = [], [], []
    for folder in folders:
        if not reuse:
            onnx_mod.forget_templates()  # torch.onnx.export for this symbol, as before the reuse
        t0 = time.perf_counter()
        info = lstm_export.export_symbol(folder)
        whole_s.append(time.perf_counter() - t0)
        export_s.append(info["export_s"])
        graphs.append(info["graph"])
    return {"reuse": reuse, "symbols": len(folders), "total_s": sum(whole_s),
            "first_symbol_s": whole_s[0], "second_symbol_s": whole_s[1] if len(whole_s) > 1 else None,
            "median_symbol_s": statistics.median(whole_s), "median_export_s": statistics.median(export_s),
            "median_rest_s": statistics.median(w - e for w, e in zip(whole_s, export_s)),
            "graphs": {g: graphs.count(g) for g in ("exported", "reused")}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--symbols", type=int, default=64)
    p.add_argument("--out", default=None)
    p.add_argument("--shape", choices=("small", "default"), default="small")
    args = p.parse_args(argv)
    job = [*SHRUNK, "--cohort", str(args.symbols)] if args.shape == "small" else DEFAULT_MODEL
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [job_wall(Path(tmp), args.symbols, False, job), job_wall(Path(tmp), args.symbols, True, job)]
        folders = sorted((Path(tmp) / f"trained-{args.symbols}" / "symbols").iterdir())
        import torch

        torch.set_num_threads(1)  # as the job's worker (OMP_NUM_THREADS=1 above)
        export_all(folders[:1], reuse=False)  # the process's first export warms torch.onnx up: for neither row
        in_process = [export_all(folders, reuse=True), export_all(folders, reuse=False)]
    record = {"benchmark": "lstm_export", "device": "cpu", "symbols": args.symbols, "job": job, "jobs": jobs,
              "export_symbol": in_process,
              "exports_total_ratio_reused_over_each": in_process[0]["total_s"] / in_process[1]["total_s"],
              "job_wall_export_minus_no_export_s": jobs[1]["job_wall_s"] - jobs[0]["job_wall_s"]}
    write_record(record, args.out)
    print(json.dumps({k: v for k, v in record.items() if k not in ("machine", "versions")}, indent=1)[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
