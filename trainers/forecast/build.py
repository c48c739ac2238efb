"""The forecaster's model for a config: where evaluation, export, sizing and training all get it
(so none of them imports the training script)."""

from __future__ import annotations

from trainers.forecast.config import PRESETS, ForecastConfig, feature_names
from trainers.forecast.data import WindowStore
from trainers.forecast.model import Forecaster


def build_model(cfg: ForecastConfig, store: WindowStore | None = None) -> Forecaster:
    """`store`: the training data, whose label mean and std the model's output is scaled by."""
    shape = PRESETS[cfg.preset]
    model = Forecaster(shape.d_model, shape.n_layers, shape.n_heads, shape.d_ff, n_features=len(feature_names(cfg)),
                       window=cfg.window, dropout=cfg.dropout)
    if store is not None:
        model.target_mean.fill_(store.target_mean)
        model.target_std.fill_(store.target_std)
    return model
