"""Benchmark: aten operations dispatched per trained item, a CPU proxy for a GPU's kernel launches.

On a GPU each aten operation is at least one kernel launch (a few microseconds of host time each), so
a small model whose step dispatches thousands of them is launch-bound whatever the card. This runs a
trainer's command in this process under a TorchDispatchMode that counts every operation the main
thread dispatches (the whole job: data on the device, steps, evaluations, the end), and divides by
the items the job trained (samples for the LSTM: the sum over its symbols' runs; the runs' own count).

    python bench/ops_per_item.py --out bench/results/lstm_ops_cpu.json -- \\
        lstm train --synthetic-tickers 16 --epochs 1 --no-export --cohort 1
    (and the same with --cohort 16)

`--compare A B`: two commands' counts side by side (each a string of the CLI's arguments).

Each count is split by where the job was: `setup` (before the loop resumes: data onto the device, the
model built), `loop` (the training steps and their saves and logs: what a GPU's steps/s depends on),
`evaluation` (the loop's validations and the final evaluation: `Run.timing("evaluation")`, which `Run.finish`
runs it in) and `finish` (the rest of the finish: restoring the best checkpoint, reports; often none). `loop_ops_per_item` is the training loop's alone.  The phases follow one `Run` at a time (its
resume, timing and finish): an LSTM cohort, several runs stepping together, has no single phase, so for it only
the whole-job count means something.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import write_record  # noqa: E402


def items_trained(run_dir: Path) -> int:
    """Items the job trained: the run's own count, or the sum over an LSTM job's symbols."""
    symbols = run_dir / "symbols"
    files = sorted(symbols.glob("*/results.json")) if symbols.is_dir() else [run_dir / "results.json"]
    return sum(int(json.loads(f.read_text())["training"]["throughput"]["items_this_attempt"]) for f in files)


def count(args: list[str], root: Path) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainers.cli import main
    from trainers.runtime.run import Run

    main_thread = threading.main_thread()
    phase = ["setup"]
    by_phase = {"setup": 0, "loop": 0, "evaluation": 0, "finish": 0}

    class Counter(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            if threading.current_thread() is main_thread:
                Counter.ops += 1
                by_phase[phase[0]] += 1
            return func(*a, **(kw or {}))

    def around(method, during: str, after: str):  # a run's resume ends its set-up; its finish, the run
        def wrapper(self, *a, **k):
            phase[0] = during
            try:
                return method(self, *a, **k)
            finally:
                phase[0] = after
        return wrapper

    real = {name: getattr(Run, name) for name in ("resume", "finish")}
    real_timing = Run.timing

    def timing(self, name):  # Run.timing("evaluation") is a context manager: the phase lasts while it is open
        @contextlib.contextmanager
        def labelled():
            before = phase[0]
            phase[0] = "evaluation" if name == "evaluation" else before
            try:
                with real_timing(self, name):
                    yield
            finally:
                phase[0] = before
        return labelled()

    run_dir = root / f"run{len(list(root.iterdir()))}"
    torch.manual_seed(0)
    started = time.perf_counter()
    Run.resume, Run.finish = around(real["resume"], "setup", "loop"), around(real["finish"], "finish", "setup")
    Run.timing = timing
    try:
        with Counter():
            code = main([*args, "--run-dir", str(run_dir)])
    finally:
        Run.resume, Run.finish, Run.timing = real["resume"], real["finish"], real_timing
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"{shlex.join(args)} exited {code}")
    items = items_trained(run_dir)
    return {"command": shlex.join(["trainers", *args]), "aten_ops": Counter.ops, "items": items,
            "ops_per_item": Counter.ops / items, "ops_by_phase": by_phase, "loop_ops_per_item": by_phase["loop"] / items,
            "wall_s_counted": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), required=True,
                   help="two commands (the CLI's arguments, quoted), counted one after the other")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [count(shlex.split(c), Path(tmp)) for c in args.compare]
    record = {"benchmark": "ops_per_item", "device": "cpu", "before": rows[0], "after": rows[1],
              "ops_per_item_ratio_before_over_after": rows[0]["ops_per_item"] / rows[1]["ops_per_item"],
              "loop_ops_per_item_ratio_before_over_after": rows[0]["loop_ops_per_item"] / rows[1]["loop_ops_per_item"]}
    write_record(record, args.out)
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
