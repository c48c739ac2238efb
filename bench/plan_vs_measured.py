"""How far `trainers plan` was from a GPU run's measurements: before (the predictions bench/gpu.py made
before measuring, gpu_plan.json, at the MFU the plan had then) and now (the same plans again, today's
plan code reading the measured MFU that run committed); and the plan's memory per GPU beside the peak
`torch.cuda.max_memory_allocated` measured (which leaves out the CUDA context: the plan's `overhead` line,
so both the plan's total and its total without that line are compared).

    python bench/plan_vs_measured.py --dir bench/results/gpu_h200 --out bench/results/gpu_h200/plan_vs_measured.json

Runs `trainers plan`'s own code on the CPU (no GPU needed). A figure's measured value comes from the
same JSON gpu_summary.py reads for it: the forecaster's compiled kit rate (train_gpu_compiled.json), a GPT
run's tokens/s (gpt_throughput_gpu.json), a trainer run's steady rate (run_<trainer>_gpu.json).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from record import provenance  # noqa: E402


def read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def measured(folder: Path, figure: str) -> float | None:
    """The measured rate (items/s, the plan's unit) of a figure of gpu_plan.json, if the run measured it."""
    words = figure.split()
    if words[0] == "forecast":
        rows = read(folder / "train_gpu_compiled.json").get("results", [])
        row = next((r for r in rows if isinstance(r, dict) and r.get("preset") == words[1]), {})
        return (row.get("kit") or {}).get("samples_per_s")
    if words[0] == "gpt":
        depth, parallel = int(words[1][1:]), words[2]
        rows = read(folder / "gpt_throughput_gpu.json").get("rows", [])
        rates = [r["tokens_per_s_per_device"] for r in rows if r.get("depth") == depth and r.get("parallel") == parallel
                 and r.get("compile") == "on" and "tokens_per_s_per_device" in r]
        return max(rates) if rates else None
    if words[0] == "run":  # as gpu_summary.py reads it: the steady rate (the GNN's nodes, the LSTM job's rate)
        record = read(folder / f"run_{words[1]}_gpu.json")
        if (record.get("training") or {}).get("stop_reason") != "completed":
            return None
        x = (record.get("results") or [{}])[0]
        if words[1] == "gnn":
            return x.get("nodes_per_s") or x.get("per_s_steady")
        return x.get("per_s_job") if words[1] == "lstm" else x.get("per_s_steady")
    return None


def measured_peak(folder: Path, figure: str) -> dict[str, int]:
    """Peak allocated bytes measured for a figure, by configuration (the forecaster eager and compiled)."""
    words = figure.split()
    if words[0] == "forecast":
        peaks = {}
        for mode in ("eager", "compiled"):
            rows = read(folder / f"train_gpu_{mode}.json").get("results", [])
            row = next((r for r in rows if isinstance(r, dict) and r.get("preset") == words[1]), {})
            if (row.get("kit") or {}).get("peak_memory_bytes"):
                peaks[mode] = row["kit"]["peak_memory_bytes"]
        return peaks
    if words[0] == "gpt":
        rows = read(folder / "gpt_throughput_gpu.json").get("rows", [])
        return {f"compile {r['compile']}": r["peak_memory_bytes"] for r in rows
                if r.get("depth") == int(words[1][1:]) and r.get("parallel") == words[2] and r.get("peak_memory_bytes")}
    return {}


def plan_now(command: str) -> dict:
    """The plan of a gpu_plan.json command, computed again by today's code."""
    from trainers.ops.commands import load_workload
    from trainers.ops.devices import DEVICES
    from trainers.ops.plan import plan

    args = shlex.split(command)[4:]  # after `python -m trainers plan`
    take = lambda flag: args[args.index(flag) + 1] if flag in args else None  # noqa: E731
    trainer, gpus, gpu, parallel = take("--trainer"), int(take("--gpus")), take("--gpu"), take("--parallel") or "auto"
    rest, skip = [], {"--trainer", "--gpus", "--gpu", "--parallel"}
    i = 0
    while i < len(args):
        if args[i] in skip:
            i += 2
            continue
        rest.append(args[i])
        i += 1
    w = load_workload(trainer, rest)
    p = plan(w, DEVICES[gpu], gpus, parallel)
    memory = p.strategies[p.chosen]["memory_bytes"] if p.chosen else {}
    return {"items_per_s": p.time["items_per_s"], "mfu": p.mfu, "strategy": p.chosen,
            "memory_total_bytes": memory.get("total"), "memory_overhead_bytes": memory.get("overhead")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True, help="a GPU run's folder (gpu_plan.json and the measured JSONs)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    predictions = read(args.dir / "gpu_plan.json").get("predictions", {})
    rows = []
    for figure, before in predictions.items():
        if not isinstance(before, dict) or "items_per_s" not in before:
            continue
        value = measured(args.dir, figure)
        now = plan_now(before["command"])
        peaks = measured_peak(args.dir, figure)
        total, overhead = now["memory_total_bytes"], now["memory_overhead_bytes"] or 0
        memory = {config: {"peak_bytes": peak, "over_plan_total": peak / total,
                           "over_plan_without_overhead": peak / (total - overhead)}
                  for config, peak in peaks.items()} if total else {}
        rows.append({"figure": figure, "unit": before["unit"], "command": before["command"], "measured": value,
                     "plan_before": {"items_per_s": before["items_per_s"], "mfu": before["mfu"]},
                     "plan_now": now,
                     "measured_over_plan_before": value / before["items_per_s"] if value else None,
                     "measured_over_plan_now": value / now["items_per_s"] if value else None,
                     "memory": memory})
        print(f"{figure}: measured {value if value is None else round(value):} {before['unit']}/s; plan before "
              f"{before['items_per_s']:,.0f} (MFU {before['mfu']['value']:.1%}), now {now['items_per_s']:,.0f} "
              f"(MFU {now['mfu']['value']:.1%}, {now['mfu']['source']})")
    folder = args.dir.resolve()
    args.out.write_text(json.dumps({"benchmark": "plan_vs_measured", "rows": rows, **provenance(),
                                    "folder": str(folder.relative_to(REPO) if folder.is_relative_to(REPO) else folder)},
                                   indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
