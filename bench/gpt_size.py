"""The GPT README's memory table: `trainers gpt size` at each depth, recorded with its command.

    python bench/gpt_size.py [--depths 12,20,26,44,64] [--world-size 8] [--device-batch-size 4]
                             [--out bench/results/gpt_size.json]

Nothing is timed: these are the estimator's numbers (parameters and FLOPs per token counted by
`trainers/gpt/size.py`, memory per GPU for DDP, FSDP2 and FSDP2 with activation checkpointing), run
through the CLI exactly as the README's command does, so a figure the README prints can be checked
against them. Per depth it adds the AdamW training state (fp32 weights, gradients and both moments,
unsharded: what DDP holds per GPU) in bytes and per parameter.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402


def size(depth: int, world_size: int, device_batch_size: int) -> dict:
    command = [sys.executable, "-m", "trainers", "gpt", "size", "--depth", str(depth), "--world-size", str(world_size),
               "--device-batch-size", str(device_batch_size)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    row = json.loads(out.stdout)
    ddp = next(r for r in row["layouts"] if r["layout"] == "ddp")
    state = ddp["weights"] + ddp["grads"] + ddp["optimizer"]
    row["command"] = "trainers " + " ".join(command[3:])
    row["ddp_training_state_bytes"] = state
    row["ddp_training_state_bytes_per_parameter"] = state / row["parameters"]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depths", default="12,20,26,44,64")
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--device-batch-size", type=int, default=4)
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = p.parse_args()
    rows = [size(int(d), args.world_size, args.device_batch_size) for d in args.depths.split(",")]
    record = {"benchmark": "gpt_size", "what": "the estimator's numbers (computed, not timed)", "depths": rows}
    write_record(record, args.out)
    for r in rows:
        gib = ", ".join(f"{x['layout']} {x['total_gib']:.1f} GiB{'' if x['fits'] else ' (no)'}" for x in r["layouts"])
        print(f"depth {r['depth']} dim {r['dim']}: {r['parameters'] / 1e9:.3f}B, {r['flops_per_token']:.2e} FLOPs/token; {gib}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
