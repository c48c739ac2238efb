"""The colouring model for a config: where training, evaluation, export, fine-tuning and sizing get it."""

from __future__ import annotations

from trainers.gnn.config import GnnConfig
from trainers.gnn.model import ColoringGNN


def build_model(cfg: GnnConfig) -> ColoringGNN:
    return ColoringGNN(cfg.in_dim, cfg.hidden, cfg.layers, cfg.max_colors, cfg.dropout)
