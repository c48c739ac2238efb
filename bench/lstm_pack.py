"""Benchmark: seed 003's claim ("train the symbols in parallel, one per GPU") measured on what we have.

Part 1, the kit's own command end to end (`trainers lstm train`, per-symbol runs with checkpoints,
evaluation and results; --no-export, export is timed once on its own), for N symbols:
  sequential      one process, one symbol after another (torch threads: 1, then every core)
  packed          torchrun workers taking symbols from the c10d queue (2 workers, 1 thread each)
  packed, 2/dev   4 workers on the same 2 cores: two jobs per device, as --jobs-per-gpu 2 does on a GPU
Each row: wall time of the command (process start included), the job's own wall time, the sum of
per-symbol times and the packing efficiency from results.json.

Part 2, the training step alone (in one process, one intra-op thread): G independent LSTMs trained
one after another with nn.LSTM, the same split over two Python threads, and the same G models
stacked into one grouped LSTM (one batched matmul per time step for all G). vmap over nn.LSTM is
not possible (torch has no batching rule for aten::lstm), hence the hand-written grouped cell,
checked to compute the same logits as nn.LSTM.

The data and model are shrunk to run in minutes on 2 CPU cores: synthetic bars, 800 days, window
16, hidden 16, 2 layers, batch 64, 2 epochs (10 steps per symbol). CPU numbers only.

    python bench/lstm_pack.py --out bench/results/lstm_pack_cpu.json
    python bench/lstm_pack.py --steps-only --out bench/results/lstm_step_cpu.json
    python bench/lstm_pack.py --symbols 64,500 --cohorts 64 --baseline-max 64 --out bench/results/lstm_cohort_cpu.json
    python bench/lstm_pack.py --symbols 64,500 --cohorts auto --baseline-max 64 --shape default --epochs 5 \
        --device auto --out bench/results/lstm_cohort_gpu.json         (make bench-gpu's lstm_cohort step)

Part 3 (--cohorts): the same job, one process, one symbol at a time against cohorts of K symbols
stacked into one model (trainers.lstm.cohort).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

SHRUNK = ["--synthetic-days", "800", "--window", "16", "--hidden", "16", "--layers", "2", "--batch-size", "64",
          "--epochs", "2", "--no-export", "--device", "cpu", "--patience", "0"]


def run_job(n: int, workers: int, threads: int, root: Path, label: str, extra: tuple[str, ...] = ("--cohort", "1"),
            shape: tuple[str, ...] = tuple(SHRUNK), keep: Path | None = None) -> dict:
    run_dir = root / f"{label}-{n}"
    args = ["-m", "trainers", "lstm", "train", "--run-dir", str(run_dir), "--synthetic-tickers", str(n), *shape,
            *extra]
    if workers > 1:
        args = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={workers}", *args]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("TRAINERS_FAULT", None)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    r = json.loads((run_dir / "results.json").read_text())
    if keep is not None:  # the job's own record (per-symbol times, packing) and log, beside the benchmark's JSON
        keep.mkdir(parents=True, exist_ok=True)
        for name in ("results.json", "training.log"):
            shutil.copyfile(run_dir / name, keep / f"{label}-{n}-{name}")
    t = r["training"]
    assert t["symbols"]["ok"] == n, t["symbols"]
    per_symbol = [row["seconds"] for row in r["symbols"].values()]
    cohorts = [json.loads(p.read_text()).get("cohort", 1) for p in run_dir.glob("symbols/*/done.json")]
    return {"mode": label, "symbols": n, "workers": workers, "threads_per_worker": threads,
            "command_wall_s": wall, "job_wall_s": t["wall_time_s_this_attempt"],
            "sum_symbol_s": t["packing"]["sum_symbol_seconds"], "packing_efficiency": t["packing"]["efficiency"],
            "symbols_per_s": n / wall, "median_symbol_s": sorted(per_symbol)[len(per_symbol) // 2],
            "steps_per_symbol": t["steps"] // n, "largest_cohort": max(cohorts),
            "share_outside_steps": t["packing"].get("share_outside_steps"),
            **({"phase_s": t["packing"]["sum_phase_seconds"]} if "sum_phase_seconds" in t["packing"] else {})}


def time_export(root: Path) -> dict:
    run_dir = root / "sequential-3"
    env = dict(os.environ, OMP_NUM_THREADS="2")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainers", "lstm", "export", "--run-dir", str(run_dir), "--symbols",
                    "SYN000", "--latency-iters", "5"], check=True, capture_output=True, text=True, env=env)
    info = json.loads((run_dir / "symbols" / "SYN000" / "export.json").read_text())
    return {"command_wall_s": time.perf_counter() - t0, "export_s": info["export_s"],
            "max_abs_error": info["parity"]["max_abs_error"]}


def step_benchmark(groups: int, steps: int, threads: int) -> dict:
    """G models x `steps` AdamW steps: nn.LSTM one model at a time vs one grouped LSTM."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    F, H, L, B, T = 11, 16, 2, 64, 16
    x = torch.randn(groups, B, T, F)
    y = (torch.rand(groups, B) > 0.5).float()

    class Grouped(torch.nn.Module):
        """G independent stacked LSTMs + heads; gates by batched matmul over the group."""

        def __init__(self):
            super().__init__()
            k = 1 / H ** 0.5
            self.w_ih = torch.nn.ParameterList([torch.nn.Parameter(torch.empty(groups, F if i == 0 else H, 4 * H)
                                                                  .uniform_(-k, k)) for i in range(L)])
            self.w_hh = torch.nn.ParameterList([torch.nn.Parameter(torch.empty(groups, H, 4 * H).uniform_(-k, k))
                                                for _ in range(L)])
            self.b = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(groups, 1, 4 * H)) for _ in range(L)])
            self.head = torch.nn.Parameter(torch.empty(groups, H, 1).uniform_(-k, k))

        def forward(self, seq):  # [G, B, T, F] -> logits [G, B]
            for i in range(L):
                inputs = torch.matmul(seq, self.w_ih[i].unsqueeze(1)) + self.b[i].unsqueeze(1)  # [G, B, T, 4H]
                h = seq.new_zeros(groups, seq.shape[1], H)
                c = torch.zeros_like(h)
                outs = []
                for t in range(seq.shape[2]):
                    gates = inputs[:, :, t] + torch.bmm(h, self.w_hh[i])
                    ig, fg, gg, og = gates.chunk(4, dim=-1)
                    c = torch.sigmoid(fg) * c + torch.sigmoid(ig) * torch.tanh(gg)
                    h = torch.sigmoid(og) * torch.tanh(c)
                    outs.append(h)
                seq = torch.stack(outs, dim=2)
            return torch.bmm(seq[:, :, -1], self.head).squeeze(-1)

    def loop(model_fn, params, batches):
        opt = torch.optim.AdamW(params, lr=1e-3)
        loss_fn = torch.nn.functional.binary_cross_entropy_with_logits
        for xb, yb in batches:
            loss = loss_fn(model_fn(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    models = [torch.nn.ModuleDict({"lstm": torch.nn.LSTM(F, H, L, batch_first=True), "head": torch.nn.Linear(H, 1)})
              for _ in range(groups)]
    loop(lambda xb: models[0]["head"](models[0]["lstm"](xb)[0][:, -1]).squeeze(-1), list(models[0].parameters()),
         [(x[0], y[0])] * 3)  # warm-up
    t0 = time.perf_counter()
    for g, m in enumerate(models):
        loop(lambda xb, m=m: m["head"](m["lstm"](xb)[0][:, -1]).squeeze(-1), list(m.parameters()),
             [(x[g], y[g])] * steps)
    sequential = time.perf_counter() - t0
    # the same G models split over two Python threads (torch ops release the GIL; one intra-op thread each)
    halves = [list(range(0, groups, 2)), list(range(1, groups, 2))]
    t0 = time.perf_counter()
    threads_ = [threading.Thread(target=lambda part: [loop(lambda xb, m=models[g]: m["head"](m["lstm"](xb)[0][:, -1])
                                                           .squeeze(-1), list(models[g].parameters()),
                                                           [(x[g], y[g])] * steps) for g in part], args=(h,))
                for h in halves]
    for t in threads_:
        t.start()
    for t in threads_:
        t.join()
    two_threads = time.perf_counter() - t0
    grouped = Grouped()
    with torch.no_grad():  # the same model: group 0 given model 0's weights computes model 0's logits
        for i in range(L):
            lstm = models[0]["lstm"]
            grouped.w_ih[i][0] = getattr(lstm, f"weight_ih_l{i}").T
            grouped.w_hh[i][0] = getattr(lstm, f"weight_hh_l{i}").T
            grouped.b[i][0, 0] = getattr(lstm, f"bias_ih_l{i}") + getattr(lstm, f"bias_hh_l{i}")
        grouped.head[0] = models[0]["head"].weight.T
        want = models[0]["head"](models[0]["lstm"](x[0])[0][:, -1]).squeeze(-1) - models[0]["head"].bias
        assert torch.allclose(grouped(x)[0], want, atol=1e-5), "the grouped LSTM is not the same model"
    loop(grouped, list(grouped.parameters()), [(x, y)] * 3)  # warm-up
    t0 = time.perf_counter()
    loop(grouped, list(grouped.parameters()), [(x, y)] * steps)
    stacked = time.perf_counter() - t0
    return {"models": groups, "steps": steps, "threads": threads, "shape": {"features": F, "hidden": H, "layers": L,
                                                                            "batch": B, "window": T},
            "nn_lstm_one_after_another_s": sequential, "nn_lstm_two_python_threads_s": two_threads,
            "grouped_lstm_s": stacked, "two_threads_speedup": sequential / two_threads,
            "model_steps_per_s_nn_lstm": groups * steps / sequential,
            "model_steps_per_s_grouped": groups * steps / stacked, "grouped_speedup": sequential / stacked}


def planned_job_s(symbols: int, shape: list[str], gpu: str) -> float:
    """`trainers plan`'s wall time for the job of `symbols` synthetic symbols with these train options."""
    options = [a for i, a in enumerate(shape) if a != "--device" and (i == 0 or shape[i - 1] != "--device")]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "trainers", "plan", "--trainer", "lstm", *options, "--synthetic-tickers",
                        str(symbols), "--gpus", "1", "--gpu", gpu, "--json", f"{tmp}/plan.json"], check=True,
                       capture_output=True, text=True)
        return json.loads(Path(f"{tmp}/plan.json").read_text())["time"]["hours"] * 3600


def cohort_benchmark(counts: list[int], cohorts: list[str], out: str | None, device: str, shape: list[str],
                     baseline_max: int | None, keep: Path | None = None, plan_gpu: str | None = None) -> int:
    """Part 3: the same job one symbol at a time and in cohorts (`auto`: the job's own choice); the
    figures the job itself records. One symbol at a time is skipped past `baseline_max` symbols."""
    rows = []
    load_at_start = os.getloadavg()
    shape = [*shape, "--device", device]
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            for k in ["1", *cohorts]:
                if k == "1" and baseline_max is not None and n > baseline_max:
                    continue
                row = run_job(n, 1, int(os.environ.get("OMP_NUM_THREADS", "1")), Path(tmp), f"cohort{k}",
                              () if k == "auto" else ("--cohort", k), tuple(shape), keep)
                row["cohort"] = k
                rows.append(row)
                print(json.dumps(row), flush=True)
    if plan_gpu:  # what `trainers plan` predicts for each job, with the job's own --cohort (auto: the plan's)
        for row in rows:
            cohort = [] if row["cohort"] == "auto" else ["--cohort", row["cohort"]]
            row["plan_job_s"] = planned_job_s(row["symbols"], [*shape, *cohort], plan_gpu)
            row["job_wall_over_plan"] = row["job_wall_s"] / row["plan_job_s"]
    by = {(r["symbols"], r["cohort"]): r for r in rows}
    ratio = {f"{n} symbols, cohort {k}": by[(n, k)]["job_wall_s"] / by[(n, "1")]["job_wall_s"]
             for n in counts for k in cohorts if (n, "1") in by}
    record = {"benchmark": "lstm_cohort", "device": device, "job": shape, "jobs": rows,
              "job_wall_ratio_cohort_vs_one_at_a_time": ratio,
              "load_average_1_5_15": {"start": load_at_start, "end": os.getloadavg()}}
    write_record(record, out)
    print(json.dumps(ratio, indent=1))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--symbols", default="3,16,64")
    p.add_argument("--out", default=None)
    p.add_argument("--steps-only", action="store_true", help="only part 2 (the training step, in this process)")
    p.add_argument("--cohorts", default=None, metavar="K,K",
                   help="only part 3: one process training --symbols one at a time (--cohort 1) and in cohorts of "
                        "each K (trainers.lstm.cohort; auto: the job's own choice), the same job otherwise")
    p.add_argument("--device", default="cpu", help="part 3's --device (cpu, auto, cuda)")
    p.add_argument("--shape", choices=("small", "default"), default="small",
                   help="part 3's job: the small shape of parts 1 and 2, or the LSTM trainer's default model")
    p.add_argument("--epochs", type=int, default=None, help="part 3: epochs per symbol (default: the shape's)")
    p.add_argument("--baseline-max", type=int, default=None,
                   help="part 3: run --cohort 1 only up to this many symbols (it is the slow one)")
    p.add_argument("--plan-gpu", default=None, metavar="KEY",
                   help="part 3: beside each job, `trainers plan --gpu KEY`'s prediction of its wall time")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="part 3: copy each job's results.json and training.log into DIR (the run folders are deleted)")
    args = p.parse_args()
    if args.cohorts:
        shape = [a for a in SHRUNK if a not in ("--device", "cpu")] if args.shape == "small" else \
            ["--no-export", "--patience", "0"]
        if args.epochs is not None:
            shape = [*shape, "--epochs", str(args.epochs)]  # (the last --epochs given wins)
        return cohort_benchmark([int(n) for n in args.symbols.split(",")], args.cohorts.split(","), args.out,
                                args.device, shape, args.baseline_max, Path(args.keep) if args.keep else None,
                                args.plan_gpu)
    if args.steps_only:
        record = {"benchmark": "lstm_step", "device": "cpu", "load_average_1_5_15_start": os.getloadavg(),
                  "training_step": [step_benchmark(g, 10, 1) for g in (3, 16, 64)],
                  "load_average_1_5_15_end": os.getloadavg()}
        write_record(record, args.out)
        print(json.dumps(record["training_step"], indent=1))
        return 0
    counts = [int(n) for n in args.symbols.split(",")]
    rows = []
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n in counts:
            for label, workers, threads in (("sequential", 1, 1), ("sequential-all-cores", 1, 2),
                                            ("packed", 2, 1), ("packed-2-per-device", 4, 1)):
                if label == "sequential-all-cores" and n > 16:
                    continue  # 2 intra-op threads on tiny LSTMs are ~10x slower at 3 and 16: not worth 64
                rows.append(run_job(n, workers, threads, root, label))
                print(json.dumps(rows[-1]), flush=True)
        export = time_export(root) if 3 in counts else None
    steps = [step_benchmark(g, 10, 1) for g in (3, 16, 64)]
    for s in steps:
        print(json.dumps(s), flush=True)
    by = {(r["mode"], r["symbols"]): r for r in rows}
    speedup = {f"{n}": {m: by[("sequential", n)]["command_wall_s"] / by[(m, n)]["command_wall_s"]
                        for m in ("sequential-all-cores", "packed", "packed-2-per-device") if (m, n) in by}
               for n in counts}
    record = {"benchmark": "lstm_pack", "device": "cpu", "shrunk_job": SHRUNK, "jobs": rows,
              "load_average_1_5_15": {"start": load_at_start, "end": os.getloadavg()},  # the machine is shared: other work inflates times
              "speedup_vs_sequential_one_thread": speedup, "export_one_symbol": export, "training_step": steps}
    write_record(record, args.out)
    print(json.dumps(speedup, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
