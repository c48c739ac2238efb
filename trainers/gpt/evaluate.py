"""Validation loss of the GPT in nats per character, bits per character and per byte, beside the
baselines a character model must beat on the same windows (uniform, unigram and bigram counts
from the training split) and, for the synthetic source, the exact entropy floor.

The evaluation windows are the first `eval_tokens` of the validation split cut into windows of
seq_len + 1 (the same ones every time), dealt round-robin over ranks; every rank runs the same
number of forward passes (FSDP gathers weights in each), padding with a window it does not count.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from trainers.gpt.data import default_prompt
from trainers.gpt.infer import load_for_inference
from trainers.gpt.model import GPT, generate
from trainers.runtime.device import to_device
from trainers.runtime.dist import DistContext, all_reduce_sum
from trainers.runtime.files import atomic_write_json
from trainers.runtime.precision import Precision, autocast, precision_for
from trainers.runtime.results import merge_results
from trainers.runtime.rundir import check_data_unchanged, exclusive

LN2 = math.log(2)


def eval_window_count(n_val_tokens: int, seq_len: int, eval_tokens: int) -> int:
    return max(1, min((n_val_tokens - 1) // seq_len, eval_tokens // seq_len))


@torch.no_grad()
def validation_loss(model: GPT, val: torch.Tensor, seq_len: int, eval_tokens: int, batch: int, ctx: DistContext,
                    precision: Precision, utf8_bytes: torch.Tensor) -> dict:
    """Collective. {loss (nats/char), bpc, bpb, tokens} over the evaluation windows."""
    was_training = model.training
    model.eval()
    n = eval_window_count(len(val), seq_len, eval_tokens)
    mine = list(range(ctx.rank, n, ctx.world_size))
    rounds = math.ceil(math.ceil(n / ctx.world_size) / batch)  # the same on every rank
    nats = torch.zeros((), dtype=torch.float64, device=val.device)
    nbytes = torch.zeros((), dtype=torch.float64, device=val.device)
    counted = 0
    offsets = torch.arange(seq_len + 1, device=val.device)
    # every round's windows, padded to `batch` (padding: computed, not counted), on the device in one copy
    # that does not wait: a tensor made on the device each round would be a host wait per batch
    windows = [(mine[r * batch:(r + 1) * batch] + [0] * batch)[:batch] for r in range(rounds)]
    starts = to_device(torch.tensor(windows, dtype=torch.int64).reshape(rounds, batch), val.device)
    for r in range(rounds):
        real = len(mine[r * batch:(r + 1) * batch])
        w = val[starts[r][:, None] * seq_len + offsets].long()
        x, y = w[:, :-1], w[:, 1:]
        with autocast(val.device, precision):
            logits = model(x)
        losses = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                   reduction="none").view(batch, seq_len)
        nats += losses[:real].double().sum()
        nbytes += utf8_bytes[y[:real]].double().sum()
        counted += real * seq_len
    total_nats, total_bytes, tokens = all_reduce_sum(ctx, [float(nats), float(nbytes), float(counted)])
    model.train(was_training)
    loss = total_nats / tokens
    return {"loss": loss, "bpc": loss / LN2, "bpb": total_nats / (LN2 * total_bytes), "tokens": int(tokens)}


def eval_targets(val: np.ndarray, seq_len: int, eval_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(previous token, target) of every prediction the evaluation windows make."""
    n = eval_window_count(len(val), seq_len, eval_tokens)
    idx = (np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :])
    w = np.asarray(val)[idx].astype(np.int64)
    return w[:, :-1].ravel(), w[:, 1:].ravel()


def baselines(train: np.ndarray, val: np.ndarray, vocab_size: int, seq_len: int, eval_tokens: int) -> dict:
    """Nats per character of count models fitted on the training split, on the evaluation windows:
    uniform over the vocabulary; unigram (add-one); bigram with the unigram as a prior
    (p = (c(a, b) + p1(b)) / (c(a) + 1)). The bigram needs vocab^2 counts: skipped above 4096."""
    prev, target = eval_targets(val, seq_len, eval_tokens)
    train = np.asarray(train).astype(np.int64)
    uni_counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    p1 = uni_counts / uni_counts.sum()
    out = {"uniform": math.log(vocab_size), "unigram": float(-np.log(p1[target]).mean())}
    if vocab_size <= 4096:
        pair = np.bincount(train[:-1] * vocab_size + train[1:], minlength=vocab_size * vocab_size)
        pair = pair.reshape(vocab_size, vocab_size).astype(np.float64)
        p2 = (pair[prev, target] + p1[target]) / (pair[prev].sum(axis=1) + 1.0)
        out["bigram"] = float(-np.log(p2).mean())
    else:
        out["bigram"] = None
    return out


@torch.no_grad()
def sample_text(model: GPT, vocab: list[str], prompt: str, n_chars: int, seed: int, temperature: float = 1.0,
                top_k: int | None = None) -> str:
    """`n_chars` characters after `prompt` (deterministic for the seed); compiled blocks run eagerly
    here, since a growing KV cache would make them recompile at every length."""
    index = {c: i for i, c in enumerate(vocab)}
    tokens = [index[c] for c in prompt]
    g = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    with torch.compiler.set_stance("force_eager"):
        out = "".join(vocab[t] for t in generate(model, tokens, n_chars, temperature, top_k, g))
    model.train(was_training)
    return out


def evaluate_run(run_dir: Path, checkpoint: str = "best", eval_tokens: int | None = None, device: str = "auto",
                 seed: int = 0) -> dict:
    """`trainers gpt evaluate`: the chosen checkpoint on the validation windows (single process),
    merged into results.json (and written to evaluation.json)."""
    run_dir = Path(run_dir)
    loaded = load_for_inference(run_dir, checkpoint, device)
    cfg, model = loaded.cfg, loaded.model
    corpus = loaded.corpus
    with exclusive(run_dir):
        check_data_unchanged(run_dir, corpus.fingerprint, instead=f"--data {cfg.data} holds other text now; its "
                             f"evaluation needs the text the run trained on")
        ctx = DistContext(0, 0, 1, 1, loaded.device, None)
        train_np, val_np = corpus.split(cfg.val_frac)
        tokens = eval_tokens or cfg.eval_tokens
        val = torch.from_numpy(np.array(val_np, dtype=np.int64)).to(loaded.device)
        utf8 = torch.from_numpy(corpus.utf8_bytes).to(loaded.device)
        result = validation_loss(model, val, cfg.seq_len, tokens, cfg.device_batch_size, ctx,
                                 precision_for(loaded.device, cfg.precision), utf8)
        evaluation = summarise(result, baselines(train_np, val_np, len(corpus.vocab), cfg.seq_len, tokens),
                               corpus.floor, loaded.step)
        prompt = default_prompt(corpus.vocab)
        evaluation["samples"] = [prompt + sample_text(model, corpus.vocab, prompt, cfg.sample_chars or 200, seed)]
        atomic_write_json(run_dir / "evaluation.json", evaluation)
        merge_results(run_dir, {"evaluation": evaluation})
        return evaluation


def summarise(result: dict, base: dict, floor: dict | None, step: int | None) -> dict:
    """The evaluation section: the model beside its baselines, and its distance to the floor."""
    out = {"checkpoint_step": step, "val_loss": result["loss"], "val_bpc": result["bpc"], "val_bpb": result["bpb"],
           "tokens": result["tokens"], "baselines_nats": base,
           "beats": {name: result["loss"] < value for name, value in base.items() if value is not None}}
    if floor:
        out["entropy_floor_nats"] = floor["window_floor_nats"]
        out["entropy_rate_nats"] = floor["entropy_rate_nats"]
        # the floor is an expectation (markov.window_floor, over the contexts these windows give each
        # prediction) and the windows a sample of the text: a model at the floor lands a little above
        # or below it, by about the sample's standard error (tests/gpt/test_gpt_units.py)
        out["gap_to_floor_nats"] = result["loss"] - floor["window_floor_nats"]
    return out
