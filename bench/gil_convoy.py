"""Benchmark: what checkpoints written behind the loop cost the loop's own thread (the GIL's convoy).

A GPU run's main thread spends its time launching kernels: a few microseconds of host work each, with the GIL
released around the call. A write behind the loop (`runtime.async_save.BackgroundWrite`: `torch.save`, the
file's SHA-256, its fsync) runs in a thread that holds the GIL while it pickles; each time the main thread lets
the GIL go for an op, it may wait for the writer to give it back. An LSTM cohort writes every member's
checkpoint behind the loop, each member in a thread of its own, so at an epoch's end K writers run beside the
next steps' launches. On the H200 the 64-symbol cohort job's profile put its main thread's largest times in
cheap calls (a reshape at about 1 ms; bench/results/gpu_h200/profile_lstm_cohort_gpu.runs.json).

This times, in one process: the main thread's tiny in-place op (the stand-in for a launch: the same binding,
the same GIL release) alone, then with 1 and with 4 threads each writing a default LSTM member's checkpoint
(its model and AdamW state, 30 tensors, as trainers.lstm.stacked.host_rows hands them over) again and again
through the kit's own `atomic_torch_save`, in `--dir` (the run folder's filesystem).

    python bench/gil_convoy.py --dir /tmp/convoy --out bench/results/gil_convoy_cpu.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from record import write_record  # noqa: E402

from trainers.lstm.model import DirectionLSTM  # noqa: E402
from trainers.runtime.async_save import BackgroundWrite  # noqa: E402
from trainers.runtime.checkpoint import atomic_torch_save  # noqa: E402


def member_state() -> dict:
    """A default LSTM member's checkpoint: its DirectionLSTM state dict and AdamW state after a step."""
    model = DirectionLSTM(11, 64, 2, 0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64, 11)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def op_microseconds(ops: int) -> float:
    x = torch.zeros(8)
    t0 = time.perf_counter()
    for _ in range(ops):
        x.add_(1)
    return (time.perf_counter() - t0) * 1e6 / ops


def with_writers(folder: Path, writers: int, state: dict, ops: int, mode: str) -> dict:
    """`mode`: "threads" (each writer pickles when it likes, as K members' writes behind the loop did), "turns"
    (the writers take turns: one lock), "kit" (each writer a member's checkpointer: one
    runtime.async_save.BackgroundWrite after another, the kit's own rule)."""
    stop, saves, turn = threading.Event(), [0] * writers, threading.Lock()

    def save(i: int) -> None:
        if mode == "turns":
            with turn:
                atomic_torch_save(folder / f"member{i}.pt", state)
        elif mode == "kit":
            BackgroundWrite(saves[i], {}, lambda: {"member": atomic_torch_save(folder / f"member{i}.pt", state)}).wait()
        else:
            atomic_torch_save(folder / f"member{i}.pt", state)

    def write(i: int) -> None:
        while not stop.is_set():
            save(i)
            saves[i] += 1

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(writers)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # the writers under way
    t0 = time.perf_counter()
    per_op = op_microseconds(ops)
    seconds = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    return {"writers": writers, "mode": mode, "op_us": per_op,
            "saves_per_s": sum(saves) / seconds if writers else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None, help="folder for the writers' files (default: a temporary one)")
    p.add_argument("--ops", type=int, default=20000, help="main-thread ops per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    state = member_state()
    cases = [(0, "alone"), (1, "threads"), (4, "threads"), (4, "turns"), (4, "kit")]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = [with_writers(Path(tmp), writers, state, args.ops, mode) for _ in range(args.repeats)
                for writers, mode in cases]
    summary = {}
    for writers, mode in cases:
        mine = [r for r in rows if (r["writers"], r["mode"]) == (writers, mode)]
        name = mode if writers == 0 else f"{mode}_{writers}"
        summary[name] = {"op_us_median": statistics.median(r["op_us"] for r in mine),
                         "saves_per_s_median": statistics.median(r["saves_per_s"] for r in mine) if writers else None}
        saves = summary[name]["saves_per_s_median"]
        print(f"{name}: {summary[name]['op_us_median']:.1f} us per main-thread op"
              + (f", {saves:.0f} saves/s" if saves else ""))
    alone = summary["alone"]["op_us_median"]
    result = {"benchmark": "gil_convoy", "ops": args.ops, "rows": rows, "by_case": summary,
              "slowdown": {name: row["op_us_median"] / alone for name, row in summary.items()}}
    if args.out:
        write_record(result, args.out)


if __name__ == "__main__":
    main()
