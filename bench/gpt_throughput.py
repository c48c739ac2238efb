"""Benchmark: the char-level GPT's training throughput (tokens/s, MFU) by depth, eager and compiled,
DDP and FSDP2, measured by the trainer itself (`trainers gpt train` under torchrun: steady-state
windows after warm-up, device-synchronised at their edges; MFU against the GPU's dense bf16 peak).

On GPUs (the goal is >= 50 % bf16 MFU at d20 on one H100), every combination of the lists, or the
runs named one by one with --runs DEPTH:COMPILE:PARALLEL,... (what `make bench-gpu` does):

    python bench/gpt_throughput.py --nproc 8 --depths 12,20,26 --seq-len 2048 --device-batch-size 8 \
        --compile off,on --parallel ddp,fsdp --steps 40 --out bench/results/gpt_throughput_gpu.json
    python bench/gpt_throughput.py --nproc 1 --runs 12:on:ddp,20:off:ddp,20:on:ddp,20:on:fsdp --steps 30 \
        --run-timeout 170 --out bench/results/gpt_throughput_gpu.json

Each run has its own timeout (--run-timeout: torchrun and its workers are killed together and the
row says so; the next run goes on), its folder is deleted once read (a d26 checkpoint is 17 GB), and
the JSON is rewritten after every run, so a benchmark stopped from outside keeps the rows it measured.

A reduced CPU configuration (what bench/results/gpt_throughput_cpu.json holds; no GPU numbers):

    python bench/gpt_throughput.py --device cpu --nproc 2 --depths 1,2 --head-dim 32 --seq-len 128 \
        --device-batch-size 4 --compile off --parallel ddp,fsdp --steps 30 \
        --out bench/results/gpt_throughput_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu import last_error, run_command  # noqa: E402  (a run that hangs is ended with every worker torchrun started)
from record import write_record  # noqa: E402


def run_one(args, depth: int, compile_: str, parallel: str, root: Path) -> dict:
    run = root / f"d{depth}-{compile_}-{parallel}"
    batch_tokens = args.nproc * args.device_batch_size * args.seq_len
    chars = args.synthetic_chars or max(2_000_000, 4 * batch_tokens)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", "-m",
           "trainers", "gpt", "train", "--run-dir", str(run), "--device", args.device, "--depth", str(depth),
           "--head-dim", str(args.head_dim), "--seq-len", str(args.seq_len), "--device-batch-size",
           str(args.device_batch_size), "--batch-tokens", str(batch_tokens), "--max-steps", str(args.steps),
           "--log-every", str(args.log_every), "--eval-every", str(args.steps), "--eval-tokens",
           str(args.seq_len * args.nproc), "--sample-chars", "0", "--compile", compile_, "--parallel", parallel,
           "--synthetic-chars", str(chars), "--warmup-steps", "5"]
    repo = str(Path(__file__).resolve().parents[1])  # `-m trainers` from a checkout that is not pip-installed
    env = dict(os.environ, TRAINERS_PROGRESS="0",
               PYTHONPATH=os.pathsep.join(x for x in (repo, os.environ.get("PYTHONPATH")) if x))
    with tempfile.TemporaryFile("w+") as log:
        code, _seconds = run_command(cmd, log, env, args.run_timeout, cwd=Path.cwd())
        log.seek(0)
        output = log.read()
    row = {"depth": depth, "compile": compile_, "parallel": parallel, "seq_len": args.seq_len,
           "device_batch_size": args.device_batch_size, "world_size": args.nproc, "batch_tokens": batch_tokens,
           "steps": args.steps}
    try:
        if code is None:
            row["error"] = f"timed out after {args.run_timeout:g} s (torchrun and its workers killed)"
            return row
        if code != 0:
            row["error"] = last_error(output) or f"exit {code}"
            return row
        r = json.loads((run / "results.json").read_text())
        t = r["training"]
        train_logs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                      if json.loads(line)["kind"] == "train"]
    finally:
        shutil.rmtree(run, ignore_errors=True)  # checkpoints of GBs: only the numbers are kept
    row.update({"parameters": r["model"]["parameters"], "flops_per_token": r["model"]["flops_per_token"],
                "tokens_per_s": t["throughput"]["per_s_steady"],
                "tokens_per_s_per_device": t["throughput"]["per_s_per_device"],
                "mfu": t["mfu"], "steady_steps": t["throughput"]["steady_steps"],
                "step_time_s_last_window": train_logs[-1]["step_time_s"] if train_logs else None,
                "peak_memory_bytes": t["peak_memory_bytes"], "device_name": t["device_name"],
                "layout": f"{t['parallel']}{' + activation checkpointing' if t['activation_checkpointing'] else ''}",
                "memory_estimate": t["memory_estimate"], "breakdown_s": t["throughput"]["breakdown_s"]})
    return row


def parse_runs(args) -> list[tuple[int, str, str]]:
    if args.runs:
        runs = []
        for item in args.runs.split(","):
            parts = item.split(":")
            if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in ("off", "on") or \
                    parts[2] not in ("ddp", "fsdp"):
                raise SystemExit(f"--runs {item!r}: give DEPTH:off|on:ddp|fsdp, e.g. 20:on:ddp")
            runs.append((int(parts[0]), parts[1], parts[2]))
        return runs
    return [(int(d), c, p) for d in args.depths.split(",") for c in args.compile.split(",")
            for p in args.parallel.split(",")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--depths", default="12,20,26")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--device-batch-size", type=int, default=8)
    p.add_argument("--compile", default="off,on", help="comma list of off/on")
    p.add_argument("--parallel", default="ddp,fsdp", help="comma list of ddp/fsdp")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--runs", default=None, help="DEPTH:off|on:ddp|fsdp,... instead of every combination of "
                                                "--depths, --compile and --parallel")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds one run may take (default: no limit)")
    p.add_argument("--synthetic-chars", type=int, default=None,
                   help="characters of synthetic text (default: 2M, or 4 batches if more)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    runs = parse_runs(args)
    # stopped from outside (a timeout of make bench-gpu): SystemExit ends the run in flight with its workers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    label = "CPU (no GPU lent to this task): tokens/s only, MFU needs a GPU" if args.device == "cpu" else "GPU"
    record = {"benchmark": "gpt_throughput", "trainer": "gpt", "label": label, "device": None, "complete": False,
              "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for depth, compile_, parallel in runs:
            row = run_one(args, depth, compile_, parallel, Path(tmp))
            record["rows"].append(row)
            record["device"] = record["device"] or row.get("device_name")
            print(json.dumps({k: row.get(k) for k in ("depth", "compile", "parallel", "tokens_per_s", "mfu",
                                                      "error")}), flush=True)
            write_record(record, args.out)  # after every run: a benchmark stopped from outside keeps its rows
    record["complete"] = True
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
