"""The forecaster's model for a config: where evaluation, export, sizing and training all get it
(so none of them imports the training script)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainers.forecast.config import PRESETS, ForecastConfig, feature_names, legacy_model_fields
from trainers.forecast.data import WindowStore
from trainers.forecast.model import Forecaster, flops_per_sample


def build_model(cfg: ForecastConfig, store: WindowStore | None = None) -> Forecaster:
    """`store`: the training data, whose label mean and std the model's output is scaled by."""
    shape = PRESETS[cfg.preset]
    names = feature_names(cfg)
    model = Forecaster(shape.d_model, shape.n_layers, shape.n_heads, shape.d_ff, n_features=len(names),
                       window=cfg.window, dropout=cfg.dropout, readout=cfg.readout, linear_skip=cfg.linear_skip,
                       past_returns=names.index("ret_1d") if cfg.past_returns else None, encoder=cfg.encoder)
    if store is not None:
        model.target_mean.fill_(store.target_mean)
        model.target_std.fill_(store.target_std)
    return model


def model_flops(cfg: ForecastConfig, n_features: int, training: bool = True) -> float:
    """Matmul FLOPs per sample of the model `build_model` makes for `cfg` (its options included)."""
    shape = PRESETS[cfg.preset]
    return flops_per_sample(cfg.window, n_features, shape.d_model, shape.n_layers, shape.d_ff, training,
                            readout=cfg.readout, linear_skip=cfg.linear_skip, past_returns=cfg.past_returns,
                            encoder=cfg.encoder)


def load_trained_config(run_dir: Path) -> ForecastConfig:
    """A run folder's config, for evaluate and export: a config.json written before the model
    options existed gets their old values (the model its checkpoints hold), not today's defaults."""
    from trainers.runtime.config import saved_config
    from trainers.runtime.rundir import load_run_config

    cfg = load_run_config(Path(run_dir), ForecastConfig)
    return dataclasses.replace(cfg, **legacy_model_fields(saved_config(Path(run_dir)) or {}))
