"""Benchmark: the char-level GPT's training throughput (tokens/s, MFU) by depth, eager and compiled,
DDP and FSDP2, measured by the trainer itself (`trainers gpt train` under torchrun: steady-state
windows after warm-up, device-synchronised at their edges; MFU against the GPU's dense bf16 peak).

On GPUs (the issue's configuration; the goal is >= 50 % bf16 MFU at d20 on one H100):

    python bench/gpt_throughput.py --nproc 8 --depths 12,20,26 --seq-len 2048 --device-batch-size 8 \
        --compile off,on --parallel ddp,fsdp --steps 40 --out bench/results/gpt_throughput_gpu.json

A reduced CPU configuration (what bench/results/gpt_throughput_cpu.json holds; no GPU numbers):

    python bench/gpt_throughput.py --device cpu --nproc 2 --depths 1,2 --head-dim 32 --seq-len 128 \
        --device-batch-size 4 --compile off --parallel ddp,fsdp --steps 30 \
        --out bench/results/gpt_throughput_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402


def run_one(args, depth: int, compile_: str, parallel: str, root: Path) -> dict:
    run = root / f"d{depth}-{compile_}-{parallel}"
    batch_tokens = args.nproc * args.device_batch_size * args.seq_len
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}", "-m",
           "trainers", "gpt", "train", "--run-dir", str(run), "--device", args.device, "--depth", str(depth),
           "--head-dim", str(args.head_dim), "--seq-len", str(args.seq_len), "--device-batch-size",
           str(args.device_batch_size), "--batch-tokens", str(batch_tokens), "--max-steps", str(args.steps),
           "--log-every", str(args.log_every), "--eval-every", str(args.steps), "--eval-tokens",
           str(args.seq_len * args.nproc), "--sample-chars", "0", "--compile", compile_, "--parallel", parallel,
           "--synthetic-chars", str(max(2_000_000, 4 * batch_tokens)), "--warmup-steps", "5"]
    env = dict(os.environ, TRAINERS_PROGRESS="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    row = {"depth": depth, "compile": compile_, "parallel": parallel, "seq_len": args.seq_len,
           "device_batch_size": args.device_batch_size, "world_size": args.nproc, "batch_tokens": batch_tokens,
           "steps": args.steps}
    if proc.returncode != 0:
        row["error"] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        return row
    r = json.loads((run / "results.json").read_text())
    t = r["training"]
    train_logs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                  if json.loads(line)["kind"] == "train"]
    row.update({"parameters": r["model"]["parameters"], "flops_per_token": r["model"]["flops_per_token"],
                "tokens_per_s": t["throughput"]["per_s_steady"],
                "tokens_per_s_per_device": t["throughput"]["per_s_per_device"],
                "mfu": t["mfu"], "steady_steps": t["throughput"]["steady_steps"],
                "step_time_s_last_window": train_logs[-1]["step_time_s"] if train_logs else None,
                "peak_memory_bytes": t["peak_memory_bytes"], "device_name": t["device_name"],
                "layout": f"{t['parallel']}{' + activation checkpointing' if t['activation_checkpointing'] else ''}",
                "memory_estimate": t["memory_estimate"], "breakdown_s": t["throughput"]["breakdown_s"]})
    return row


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
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for depth in (int(d) for d in args.depths.split(",")):
            for compile_ in args.compile.split(","):
                for parallel in args.parallel.split(","):
                    row = run_one(args, depth, compile_, parallel, Path(tmp))
                    rows.append(row)
                    print(json.dumps({k: row.get(k) for k in ("depth", "compile", "parallel", "tokens_per_s", "mfu",
                                                              "error")}), flush=True)
    label = "CPU (no GPU lent to this task): tokens/s only, MFU needs a GPU" if args.device == "cpu" else "GPU"
    write_record({"benchmark": "gpt_throughput", "label": label, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
