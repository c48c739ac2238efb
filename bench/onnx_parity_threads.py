"""Benchmark: the LSTM export's parity check (trainers.onnx.check_parity: three tiny cases through PyTorch and
onnxruntime) with onnxruntime on its default threads (every core) and on one, beside torch on one thread and on
every core, on this host, in one run.

    python bench/onnx_parity_threads.py --out bench/results/onnx_parity_threads_cpu.json

Why: the H200 host (16 cores) took 0.16-0.2 s a reused symbol in a 500-symbol job's exports, the development VM
(one thread) 0.043 s (bench/results/gpu_h200/). A GPU job's torch has every core, and onnxruntime's own
pool, every core too and spinning between runs, competes with torch's threads for them. The default model's
file (random weights: the timing does not depend on them), exported once; each row the median of --rounds x --iters
checks (the settings interleaved round by round), each with a new session as an export makes one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import write_record  # noqa: E402

N_FEATURES = 11  # the default job's feature count (a synthetic symbol's export.json: input shape [batch, 64, 11])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=10, help="checks a setting and round")
    p.add_argument("--rounds", type=int, default=4, help="rounds over the four settings, interleaved")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    for name in ("iters", "rounds"):
        if not 1 <= getattr(args, name) <= 10_000:
            p.error(f"--{name} {getattr(args, name)}: give 1 to 10000")
    import torch

    from trainers.lstm.build import build_model
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.export import CHECK_BATCHES, EXPORT_BATCH, cases
    from trainers.lstm.model import UpProbability
    from trainers.onnx import check_parity, export_reusing

    cfg = LstmConfig()
    torch.manual_seed(0)
    module = UpProbability(build_model(cfg, N_FEATURES)).eval()
    checks = cases(cfg.window, N_FEATURES, CHECK_BATCHES)
    cores = os.cpu_count() or 1
    settings = [(t, o) for t in sorted({1, cores}) for o in (None, 1)]
    seconds: dict[tuple, list[float]] = {k: [] for k in settings}
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        export_reusing(module, (torch.zeros(EXPORT_BATCH, cfg.window, N_FEATURES),), path, input_names=["features"],
                       output_names=["probability"],
                       dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=1 << 20)}},
                       architecture=("bench", cfg.window, N_FEATURES))
        for round_ in range(args.rounds):  # the settings interleaved, so a burst of outside load hits them all
            for torch_threads, ort_threads in settings if round_ % 2 == 0 else settings[::-1]:
                torch.set_num_threads(torch_threads)
                for i in range(args.iters + 1):  # the first run of a round warms up
                    t0 = time.perf_counter()
                    check_parity(module, path, checks, ["features"], 1e-4, threads=ort_threads)
                    if i:
                        seconds[(torch_threads, ort_threads)].append(time.perf_counter() - t0)
    rows = [{"torch_threads": t, "onnxruntime_threads": "default" if o is None else o,
             "median_ms": 1000 * statistics.median(seconds[(t, o)]),
             "p90_ms": 1000 * sorted(seconds[(t, o)])[int(0.9 * (len(seconds[(t, o)]) - 1))],
             "checks": len(seconds[(t, o)])} for t, o in settings]
    by = {(r["torch_threads"], r["onnxruntime_threads"]): r["median_ms"] for r in rows}
    record = {"benchmark": "onnx_parity_threads", "device": "cpu", "cores": cores, "model": "lstm default",
              "cases": list(checks), "rounds": args.rounds, "rows": rows,
              "all_cores_default_over_one": by[(cores, "default")] / by[(cores, 1)],
              "one_torch_thread_default_over_one": by[(1, "default")] / by[(1, 1)],
              "load_average_1_5_15": {"start": load_at_start, "end": os.getloadavg()}}
    write_record(record, args.out)
    print(json.dumps({k: v for k, v in record.items() if k not in ("machine", "versions")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
