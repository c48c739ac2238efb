"""Benchmark: what `--remote` costs the training loop. The same forecaster run (one process, CPU) without a
remote and with one (an S3 server on loopback: moto's ThreadedMotoServer in this process), each checkpoint
uploaded behind the loop. Compared: the loop's checkpoint stall (results.json's breakdown_s.checkpoint: the
seconds the steps stood still for saves), the steady step rate, the run's wall time, and for the remote
run whether the mirror caught up and how long the end waited for it.

    python bench/remote_stall.py --out bench/results/remote_stall_cpu.json                 (a checkpoint every 100 steps)
    python bench/remote_stall.py --ckpt-every 10 --out bench/results/remote_stall_every10_cpu.json

Loopback S3 has no network latency: what this measures is the loop's share of the work (the upload
thread's CPU and GIL time beside the steps), not the time to reach a bucket across the internet, which
happens in that thread and is waited for only at the end (--remote-wait-s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

RUN = ["--synthetic-tickers", "16", "--synthetic-days", "800", "--window", "32", "--horizon", "5", "--epochs", "3",
       "--batch-size", "64", "--patience", "0", "--device", "cpu", "--log-every", "10"]


def one_run(run_dir: Path, env: dict, remote: str | None, ckpt_every: int) -> dict:
    cmd = [sys.executable, "-m", "trainers", "forecast", "train", *RUN, "--ckpt-every", str(ckpt_every), "--run-dir",
           str(run_dir)]
    if remote:
        cmd += ["--remote", remote]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    r = json.loads((run_dir / "results.json").read_text())
    t = r["training"]
    th = t["throughput"]
    return {"remote": remote is not None, "steps": t["steps"], "command_wall_s": wall,
            "checkpoint_stall_s": th["breakdown_s"]["checkpoint"], "per_s_steady": th["per_s_steady"],
            "checkpoints": t["steps"] // ckpt_every, "mirror": r.get("remote")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ckpt-every", type=int, default=100, help="steps between checkpoints (each one uploaded)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
               AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://{host}:{port}")
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="bench", aws_secret_access_key="bench",
                 region_name="us-east-1").create_bucket(Bucket="bench")
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):  # interleaved: drift in the machine's load hits both alike
                for remote in (None, f"s3://bench/run{i}"):
                    rows.append(one_run(Path(tmp) / f"{'remote' if remote else 'local'}{i}", env, remote,
                                        args.ckpt_every))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()

    def median(key: str, remote: bool) -> float:
        values = sorted(r[key] for r in rows if r["remote"] == remote)
        return values[len(values) // 2]

    summary = {key: {"local": median(key, False), "remote": median(key, True)}
               for key in ("checkpoint_stall_s", "per_s_steady", "command_wall_s")}
    per_ckpt = {k: summary["checkpoint_stall_s"][k] / rows[0]["checkpoints"] for k in ("local", "remote")}
    record = {"benchmark": "remote_stall", "device": "cpu", "run": RUN, "ckpt_every": args.ckpt_every,
              "repeats": args.repeats, "runs": rows,
              "median": summary, "stall_per_checkpoint_s": per_ckpt,
              "extra_stall_per_checkpoint_s": per_ckpt["remote"] - per_ckpt["local"],
              "steady_rate_ratio_remote_over_local": summary["per_s_steady"]["remote"] / summary["per_s_steady"]["local"],
              "load_average_1_5_15": os.getloadavg()}
    write_record(record, args.out)
    print(json.dumps({k: record[k] for k in ("median", "stall_per_checkpoint_s", "extra_stall_per_checkpoint_s",
                                             "steady_rate_ratio_remote_over_local")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
