"""Benchmark: `trainers gpt serve` under a bounded load (N clients x M requests each, all at once),
latency p50/p99 per request and generated characters per second, through the kit's own commands.

Without --run-dir it first trains the demo model (depth 1, the synthetic Markov text, 400 steps on
one CPU process) into a temporary folder:

    python bench/gpt_serve.py --clients 8 --requests 20 --max-new-tokens 16,64 --threads 1 \
        --out bench/results/gpt_serve_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.gpt.loadtest import get, load_test  # noqa: E402

DEMO = ["--depth", "1", "--head-dim", "16", "--seq-len", "64", "--batch-tokens", "2048", "--device-batch-size", "32",
        "--lr", "5e-3", "--weight-decay", "0", "--warmup-steps", "10", "--max-steps", "400", "--eval-every", "200",
        "--eval-tokens", "16384", "--synthetic-chars", "300000", "--device", "cpu"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", default=None, help="a trained run (default: train the demo model first)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=20, help="requests per client")
    p.add_argument("--max-new-tokens", default="16,64", help="comma list: one load test each")
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    env = dict(os.environ, TRAINERS_PROGRESS="0", OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp) / "run"
        if not args.run_dir:
            subprocess.run([sys.executable, "-m", "trainers", "gpt", "train", *DEMO, "--run-dir", str(run_dir)],
                           check=True, capture_output=True, env=env)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "trainers", "gpt", "serve", "--run-dir", str(run_dir),
                                   "--port", str(port), "--device", "cpu", "--threads", str(args.threads),
                                   "--max-queue", str(args.clients * 2)], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    _, health = get(url + "/health", timeout=1)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("the server did not start")
                    time.sleep(0.2)
            load_test(url + "/generate", 1, 3, {"prompt": "ab", "max_new_tokens": 8})  # warm-up
            tests = [load_test(url + "/generate", args.clients, args.requests, {"prompt": "abc", "max_new_tokens": n})
                     for n in (int(v) for v in args.max_new_tokens.split(","))]
        finally:
            server.terminate()
            server.wait(timeout=30)
    record = {"benchmark": "gpt_serve", "label": "CPU (no GPU lent to this task)", "model_parameters":
              health["parameters"], "checkpoint_step": health["checkpoint_step"], "server_threads": args.threads,
              "queue": "one generation thread, requests in arrival order (no batching)", "load_tests": tests}
    write_record(record, args.out)
    print(json.dumps(tests, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
