"""A trained GPT back from its run folder, for evaluate, sample, serve and export.

The checkpoint is `best` by default (the lowest validation loss, since the last steps may
overfit), its SHA-256 checked. An FSDP run's weights are sharded: the first use
consolidates them into one file (`consolidated_<step>.pt`, holding the run folder's lock while it
writes, its SHA-256 added to the checkpoint's meta), which later uses load directly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from trainers.errors import CheckFailed, UsageError
from trainers.gpt.build import build_model
from trainers.gpt.config import GptConfig
from trainers.gpt.data import default_prompt, load_corpus, markov_source
from trainers.gpt.model import GPT, generate
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.dist import pick_device
from trainers.runtime.rundir import exclusive, load_run_config, resolve_checkpoint, single_process_context


@dataclass
class Loaded:
    cfg: GptConfig
    vocab: list[str]
    model: GPT
    step: int
    device: torch.device

    @property
    def corpus(self):
        """The run's corpus (from the token cache, or regenerated for the synthetic source)."""
        cfg = self.cfg
        corpus = load_corpus(cfg.data, cfg.cache_dir, cfg.seq_len, cfg.val_frac, markov_source(cfg),
                             cfg.synthetic_chars, log=lambda _m: None)
        if corpus.vocab != self.vocab:
            raise UsageError(f"--data {cfg.data} now reads as another vocabulary than the checkpoint's; evaluate with "
                             f"the corpus the run trained on")
        return corpus


def checkpoints(run_dir: Path) -> CheckpointManager:
    return CheckpointManager(Path(run_dir) / "checkpoints", single_process_context(), 1, logging.getLogger("trainers"))


def load_for_inference(run_dir: Path, which: str = "best", device: str = "auto") -> Loaded:
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, GptConfig)
    ckpt = checkpoints(run_dir)
    step = resolve_checkpoint(ckpt, which)
    if "model" in ckpt.sharded_names(step):
        name = ckpt.consolidated_path(step).name
        if name not in ((ckpt.meta(step) or {}).get("files") or {}):
            try:
                with exclusive(run_dir):
                    ckpt.consolidate(step)
            except UsageError as exc:
                raise UsageError(f"checkpoint step {step} is sharded (FSDP) and not consolidated yet, and {exc}; "
                                 f"after training ends, any of sample/serve/export/evaluate consolidates it") from None
    states = ckpt.load_verified(step, "cpu")["states"]
    vocab = list(states["vocab"]["chars"])
    model = build_model(cfg, len(vocab))
    model.load_state_dict(states["model"])
    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:  # a checkpoint written before the run boundary refused to save a diverged state
        raise CheckFailed(f"checkpoint step {step} of {run_dir} holds non-finite weights ({bad[0]}{' ...' if len(bad) > 1 else ''}): "
                          f"its training diverged; pick an earlier one with --checkpoint")
    dev = pick_device(0, device)
    model.to(dev).eval()
    return Loaded(cfg, vocab, model, step, dev)


def encode(vocab: list[str], text: str) -> list[int]:
    """Token ids of `text`; a ValueError naming every character the model never saw."""
    index = {c: i for i, c in enumerate(vocab)}
    unknown = sorted({c for c in text if c not in index})
    if unknown:
        raise ValueError(f"characters outside the model's vocabulary: {''.join(unknown)!r} "
                         f"({', '.join(f'U+{ord(c):04X}' for c in unknown)})")
    return [index[c] for c in text]


def sample_run(run_dir: Path, which: str, prompt: str | None, max_new_tokens: int, temperature: float,
               top_k: int | None, seed: int, device: str = "auto") -> str:
    """`trainers gpt sample`: the prompt and its continuation."""
    loaded = load_for_inference(run_dir, which, device)
    prompt = default_prompt(loaded.vocab) if prompt is None else prompt
    if not prompt:
        raise UsageError("--prompt is empty; give at least one character (or leave it out for a newline)")
    try:
        tokens = encode(loaded.vocab, prompt)
    except ValueError as exc:
        raise UsageError(f"--prompt: {exc}") from None
    g = torch.Generator().manual_seed(seed)
    try:
        return prompt + "".join(loaded.vocab[t] for t in generate(loaded.model, tokens, max_new_tokens, temperature,
                                                                   top_k, g))
    except ValueError as exc:  # a checkpoint whose weights are not finite
        raise CheckFailed(f"checkpoint step {loaded.step} of {run_dir}: {exc}") from None
