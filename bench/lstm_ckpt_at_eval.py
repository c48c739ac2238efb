"""Benchmark: what an LSTM job's evaluations cost in checkpoints, by `--ckpt-at-eval` (always: every evaluation
written; improved: every new best written; held, the trainer's default: a new best held in host memory and written
with the symbol's next checkpoint). One job command each way, one after another, each in a process of its own, in
one run:

    python bench/lstm_ckpt_at_eval.py --out bench/results/lstm_ckpt_at_eval_cpu.json -- --synthetic-tickers 64 \\
        --synthetic-days 800 --window 16 --hidden 16 --layers 2 --batch-size 64 --epochs 5 --no-export \\
        --patience 0 --device cpu --cohort 64

Per way: the command's wall time, the job's own (results.json), its members' time in `step_done` (the cohort's part
clock: agreements, checkpoints, heartbeats), the checkpoints written (commits) and the bests held. Then whether every
symbol's final evaluation is the same each way (it should be: the best restored is the same step's, whichever way it
reached the disk).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

WAYS = ("always", "improved", "held")
ROOT = Path(__file__).resolve().parents[1]

# The job in this process, the checkpoint writes and holds counted (a fresh process a way: nothing carried over)
COUNTING = """
import json, sys
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.checkpointer import Checkpointer
counts = {"written": 0, "held": 0}
def counted(real, key):
    def call(self, *args, **kwargs):
        counts[key] += 1
        return real(self, *args, **kwargs)
    return call
CheckpointManager.commit = counted(CheckpointManager.commit, "written")
Checkpointer.hold = counted(Checkpointer.hold, "held")
from trainers.cli import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(counts, f)
sys.exit(code)
"""


def run_way(way: str, job: list[str], folder: Path) -> dict:
    run_dir, counts = folder / way, folder / f"{way}_counts.json"
    command = ["lstm", "train", *job, "--ckpt-at-eval", way, "--run-dir", str(run_dir)]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", COUNTING, str(counts), *command], cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"lstm_ckpt_at_eval: the {way} job exited {proc.returncode}: {proc.stderr[-2000:]}")
    training = json.loads((run_dir / "results.json").read_text())["training"]
    return {"way": way, "command": "trainers " + " ".join(command), "command_wall_s": wall,
            "job_wall_s": training["wall_time_s_this_attempt"],
            "step_done_s": training["packing"]["sum_phase_seconds"].get("step_done"),
            "symbols_ok": training["symbols"]["ok"], **json.loads(counts.read_text()),
            "evaluations": {p.parent.name: json.loads(p.read_text()).get("evaluation")
                            for p in sorted(run_dir.glob("symbols/*/results.json"))}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON record to write")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    parser.add_argument("job", nargs="*", help="the job's `trainers lstm train` options, after --")
    args = parser.parse_args(argv)
    ways = args.ways.split(",")
    if not args.job:
        parser.error("give the job's options after -- (its --run-dir and --ckpt-at-eval are this benchmark's)")
    if any(way not in WAYS for way in ways) or len(set(ways)) != len(ways):
        parser.error(f"--ways {args.ways}: each of {', '.join(WAYS)} at most once")
    with tempfile.TemporaryDirectory(prefix="lstm_ckpt_at_eval_") as tmp:
        rows = [run_way(way, args.job, Path(tmp)) for way in ways]
    evaluations = [row.pop("evaluations") for row in rows]
    for row in rows:
        print(f"{row['way']:>9}: job {row['job_wall_s']:.2f} s, step_done {row['step_done_s']:.2f} s, "
              f"{row['written']} checkpoints written, {row['held']} bests held")
    same = all(e == evaluations[0] for e in evaluations) and all(evaluations[0].values())
    print(f"every symbol's final evaluation the same each way: {same}")
    write_record({"benchmark": "lstm_ckpt_at_eval", "job": args.job, "ways": rows,
                  "symbols": len(evaluations[0]), "same_evaluations": same}, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
