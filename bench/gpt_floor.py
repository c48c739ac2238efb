"""Benchmark: how far the GPT's learned validation loss is from the best any model can do, on the
README's run, with the entropy floor counted for the predictions the trainer really makes.

    python bench/gpt_floor.py --out bench/results/gpt_floor_cpu.json

Re-runs the command behind the README's "validation 1.5988 nats/char" (tests/gpt/test_gpt_pipeline.py:
FSDP2 on 2 gloo ranks, depth 1, --seq-len 64, 400 steps x 2,048 tokens on 300,000 characters of the
default Markov source, rank 1 SIGKILLed at step 250 and resumed from the checkpoint of step 200):

    TRAINERS_FAULT=sigkill@rank1:step250 OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2
        --max-restarts=1 -m trainers gpt train <LEARN> --run-dir DIR

and sets its validation loss beside:
- the exact floor (markov.window_floor: contexts 1..64, since the evaluation scores targets w[1:]
  of inputs w[:-1]) and the figure once published, which also counted H(X1), a prediction from no
  context that the trainer never makes;
- the true chain as the predictor on the very windows the run was evaluated on (what a perfect model
  scores there: the floor plus this sample's noise), with its standard error;
- a Monte-Carlo estimate of the floor: the true chain on every evaluation-style window (64
  predictions, cut as validation_loss cuts them) of the default source's 2,000,000 characters.
`--run-dir DIR` measures an existing run instead of training one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402

from trainers.gpt.data import SYNTHETIC, load_corpus  # noqa: E402
from trainers.gpt.evaluate import eval_window_count  # noqa: E402
from trainers.gpt.markov import MarkovSource  # noqa: E402

# tests/gpt/test_gpt_pipeline.py's LEARN, the run the README quotes
LEARN = ["--depth", "1", "--head-dim", "16", "--seq-len", "64", "--batch-tokens", "2048", "--device-batch-size", "16",
         "--lr", "5e-3", "--weight-decay", "0", "--warmup-steps", "10", "--max-steps", "400", "--eval-every", "200",
         "--eval-tokens", "16384", "--synthetic-chars", "300000", "--log-every", "50", "--sample-chars", "40",
         "--parallel", "fsdp"]
FAULT = "sigkill@rank1:step250"


def chain_losses(src: MarkovSource, symbols: np.ndarray) -> np.ndarray:
    """-log p of each target of windows [n, seq_len + 1] (the chain's symbol indices) under the true
    chain, each prediction seeing what the evaluation gives it: the window's characters up to it."""
    a, k = src.alphabet_size, src.order
    n, width = symbols.shape
    out = np.empty((n, width - 1))
    for j in range(width - 1):
        m = min(j + 1, k)  # characters of context that matter
        context = np.zeros(n, dtype=np.int64)
        for c in symbols[:, j + 1 - m: j + 1].T:
            context = context * a + c
        out[:, j] = -np.log(src.conditional(j + 1)[context, symbols[:, j + 1]])
    return out


def windows_of(tokens: np.ndarray, vocab: list[str], src: MarkovSource, seq_len: int, n: int) -> np.ndarray:
    """The first n evaluation windows (token i*seq_len .. i*seq_len + seq_len) as the chain's symbols."""
    to_symbol = np.array([src.symbols.index(c) for c in vocab])
    return to_symbol[np.asarray(tokens, dtype=np.int64)[np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)]]


def mean_se(losses: np.ndarray) -> dict:
    per_window = losses.mean(axis=1)
    return {"mean": float(per_window.mean()), "standard_error": float(per_window.std(ddof=1) / math.sqrt(len(losses))),
            "windows": int(len(losses)), "predictions": int(losses.size)}


def train(run_dir: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINERS_FAULT": FAULT}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1",
           "-m", "trainers", "gpt", "train", *LEARN, "--run-dir", str(run_dir)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", default=None, help="measure this run instead of training one")
    p.add_argument("--mc-chars", type=int, default=2_000_000, help="characters of the Monte-Carlo estimate")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp) / "run"
        wall = None if args.run_dir else train(run_dir)
        r = json.loads((run_dir / "results.json").read_text())
        cfg, e, t = r["config"], r["evaluation"], r["training"]
        src = MarkovSource(cfg["markov_alphabet"], cfg["markov_order"], cfg["markov_concentration"], cfg["data_seed"])
        seq = cfg["seq_len"]
        corpus = load_corpus(SYNTHETIC, str(Path(tmp) / "cache"), seq, cfg["val_frac"], src, cfg["synthetic_chars"],
                             log=lambda _m: None)
        _, val = corpus.split(cfg["val_frac"])
        n = eval_window_count(len(val), seq, cfg["eval_tokens"])
        on_run_windows = mean_se(chain_losses(src, windows_of(val, corpus.vocab, src, seq, n)))
        assert n * seq == e["tokens"], (n, seq, e["tokens"])  # the same windows the run was scored on
        big = load_corpus(SYNTHETIC, str(Path(tmp) / "cache"), seq, 0.5, src, args.mc_chars, log=lambda _m: None)
        n_big = eval_window_count(len(big.tokens), seq, len(big.tokens))
        monte_carlo = mean_se(chain_losses(src, windows_of(big.tokens, big.vocab, src, seq, n_big)))

    floor = src.window_floor(seq)
    context_free = (src.context_entropy(0) + sum(src.context_entropy(m) for m in range(1, seq))) / seq
    val_loss = e["val_loss"]
    record = {
        "benchmark": "gpt_floor",
        "run": {"command": "TRAINERS_FAULT=" + FAULT + " OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 "
                           "--max-restarts=1 -m trainers gpt train " + " ".join(LEARN) + " --run-dir DIR",
                "measured_here": args.run_dir is None, "wall_s": wall, "steps": t["steps"], "restarts": t["restarts"],
                "parallel": t["parallel"], "world_size": t["world_size"], "checkpoint_step": e["checkpoint_step"],
                "parameters": r["model"]["parameters"], "evaluated_tokens": e["tokens"]},
        "source": {"alphabet": src.alphabet_size, "order": src.order, "concentration": src.concentration,
                   "seed": src.seed, "seq_len": seq},
        "val_loss_nats": val_loss,
        "baselines_nats": e["baselines_nats"],
        "entropy_rate_nats": src.entropy_rate(),
        "floor_nats": floor,
        "floor_published_before_nats": context_free,
        "floor_in_results_json_nats": e["entropy_floor_nats"],
        "true_chain_on_the_runs_windows": on_run_windows,
        "true_chain_monte_carlo": {**monte_carlo, "characters": args.mc_chars},
        "gap_to_floor_nats": val_loss - floor,
        "gap_to_floor_published_before_nats": val_loss - context_free,
        "gap_to_true_chain_on_the_same_windows_nats": val_loss - on_run_windows["mean"],
        "note": "the floor averages H(X_{m+1} | X_1..X_m) over the contexts m = 1..seq_len the evaluation's "
                "predictions have (targets w[1:] of inputs w[:-1]); the figure published before also counted "
                "H(X1), a prediction from no context, which the trainer never makes",
    }
    write_record(record, args.out)
    print(json.dumps({k: record[k] for k in ("val_loss_nats", "floor_nats", "floor_published_before_nats",
                                              "gap_to_floor_nats", "gap_to_floor_published_before_nats",
                                              "true_chain_on_the_runs_windows", "true_chain_monte_carlo")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
