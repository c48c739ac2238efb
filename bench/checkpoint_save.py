"""Benchmark: how long a checkpoint stops training, written in the loop or behind it (--ckpt-async).

    python bench/checkpoint_save.py --presets small,base --out bench/results/checkpoint_cpu.json
    python bench/checkpoint_save.py --presets base,151m --out bench/results/checkpoint_gpu.json   # GPU

For the forecaster's model and AdamW state (what the run saves), three saves each:

    sync    CheckpointManager.save: the loop stands still for the whole write (pickle, page cache, fsync)
    async   the loop stands still only for the copy into host memory (HostSnapshot: pinned and reused
            on CUDA), then trains while a thread writes; reported: the stall, the write time, the
            training steps done meanwhile, and the step time with and without the write running

The first async save allocates the pinned buffers; the stall reported is the median of the saves.
Folders go to --dir (default: a temporary folder on the same disk as the repository).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.forecast.config import PRESETS  # noqa: E402
from trainers.forecast.model import Forecaster, count_parameters  # noqa: E402
from trainers.market.windows import FEATURES  # noqa: E402
from trainers.runtime.async_save import BackgroundWrite, HostSnapshot  # noqa: E402
from trainers.runtime.checkpoint import CheckpointManager  # noqa: E402
from trainers.runtime.dist import pick_device  # noqa: E402
from trainers.runtime.info import device_name  # noqa: E402
from trainers.runtime.rundir import single_process_context  # noqa: E402

WINDOW, BATCH = 64, 8


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_preset(name: str, device: torch.device, folder: Path, saves: int) -> dict:
    s = PRESETS[name]
    model = Forecaster(s.d_model, s.n_layers, s.n_heads, s.d_ff, len(FEATURES), WINDOW).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(BATCH, WINDOW, len(FEATURES), device=device)

    def train_step() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        train_step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        train_step()
    _sync(device)
    step_s = (time.perf_counter() - t0) / 10

    ctx = single_process_context(device)
    ckpt = CheckpointManager(folder / name, ctx, keep_last=1, logger=logging.getLogger("bench"))

    def states() -> tuple[dict, dict]:
        return {"states": {"model": model.state_dict(), "optimizer": opt.state_dict()}}, {"position": {"i": 0}}

    sync_s = []
    for i in range(saves):
        t0 = time.perf_counter()
        ckpt.save(1 + i, *states(), meta={"metric": None})
        sync_s.append(time.perf_counter() - t0)
    size = sum(p.stat().st_size for p in (folder / name).glob("*.pt")) // max(1, len(list((folder / name).glob("model_*.pt"))))

    snapshot = HostSnapshot()
    stalls, writes, steps_during, step_during_s = [], [], [], []
    for i in range(saves):
        step = 100 + i
        t0 = time.perf_counter()
        shared, rank = states()
        snap = snapshot.take({"shared": shared, "rank": rank})
        pending = BackgroundWrite(step, {"metric": None}, lambda: ckpt.write_local(step, snap["shared"], snap["rank"]))
        stalls.append(time.perf_counter() - t0)
        n, t1 = 0, time.perf_counter()
        while not pending.done():
            train_step()
            _sync(device)
            n += 1
        pending.wait()
        if pending.error is not None:
            raise pending.error
        ckpt.commit(step, pending.files, pending.meta)
        writes.append(pending.seconds)
        steps_during.append(n)
        if n:
            step_during_s.append((time.perf_counter() - t1) / n)
    return {"preset": name, "parameters": count_parameters(model), "checkpoint_bytes": size,
            "train_step_s": step_s,
            "sync": {"stall_s": statistics.median(sync_s), "all_s": sync_s},
            "async": {"stall_s": statistics.median(stalls), "all_stalls_s": stalls,
                      "write_s": statistics.median(writes), "steps_during_write": steps_during,
                      "train_step_s_during_write": statistics.median(step_during_s) if step_during_s else None},
            "stall_reduction": statistics.median(sync_s) / max(statistics.median(stalls), 1e-9)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="small,base")
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = pick_device(0, args.device)  # auto: the kit's own choice (and the tests' fake accelerator's)
    with tempfile.TemporaryDirectory(dir=args.dir or Path(__file__).resolve().parents[1]) as tmp:
        rows = [one_preset(name, device, Path(tmp), args.saves) for name in args.presets.split(",")]
    for r in rows:
        print(f"{r['preset']:<6} {r['parameters'] / 1e6:7.1f}M params, {r['checkpoint_bytes'] / 2**20:8.1f} MiB: "
              f"sync stall {r['sync']['stall_s'] * 1e3:8.1f} ms | async stall {r['async']['stall_s'] * 1e3:7.1f} ms, "
              f"write {r['async']['write_s'] * 1e3:8.1f} ms behind {r['async']['steps_during_write']} steps "
              f"(step {r['train_step_s'] * 1e3:.1f} ms alone, "
              f"{(r['async']['train_step_s_during_write'] or 0) * 1e3:.1f} ms during the write)")
    write_record({"benchmark": "checkpoint_save", "device": device_name(device), "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
