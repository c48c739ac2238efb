"""The GPT for a config: where training, inference, preflight and the planner get it, and its shape
for the memory estimate (so none of them imports the training script)."""

from __future__ import annotations

from trainers.gpt import size
from trainers.gpt.config import GptConfig
from trainers.gpt.model import GPT


def build_model(cfg: GptConfig, vocab_size: int = size.SIZING_VOCAB) -> GPT:
    """The model for `cfg` (a sizing vocabulary when the corpus is not read yet: preflight builds it
    on the meta device, which allocates nothing, even at depth 64)."""
    return GPT(vocab_size, cfg.depth, cfg.head_dim, cfg.seq_len, cfg.positions, cfg.tie_embeddings)


def shape_of(cfg: GptConfig, vocab_size: int = size.SIZING_VOCAB) -> size.Shape:
    return size.Shape(cfg.depth, cfg.head_dim, vocab_size, cfg.seq_len, cfg.positions, cfg.tie_embeddings)
