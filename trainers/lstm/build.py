"""The per-symbol direction model for a config: where training, evaluation, export and sizing get it."""

from __future__ import annotations

from trainers.lstm.config import LstmConfig, n_features, parse_timeframes
from trainers.lstm.model import DirectionLSTM


def build_model(cfg: LstmConfig, n_in: int | None = None) -> DirectionLSTM:
    """`n_in` None (preflight, on the meta device): the count `--timeframes` gives, `auto` counted as
    the daily 1d,1w,1M."""
    if n_in is None:
        tfs = parse_timeframes(cfg.timeframes)
        n_in = n_features(len(tfs) if tfs else 3)
    return DirectionLSTM(n_in, cfg.hidden, cfg.layers, cfg.dropout)
