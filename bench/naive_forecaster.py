"""The reference pipeline written the way seed 000 describes it, for the benchmark only.

Per-sample windows sliced in a Dataset's __getitem__, a DataLoader with worker processes,
nn.TransformerEncoder (with its default dropout, attention dropout included), AdamW with its
defaults, fp32 (autocast on a GPU, without the rest: no fused optimizer, no compile, no TF32).
Same model size as the kit's preset (d_model, layers, heads, ff) and the same batch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class WindowDataset(Dataset):
    def __init__(self, features: np.ndarray, target: np.ndarray, ids: np.ndarray, window: int, n_tickers: int):
        self.features, self.target, self.ids = features, target, ids
        self.window, self.n_tickers = window, n_tickers

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        t, n = divmod(int(self.ids[i]), self.n_tickers)
        x = self.features[t - self.window + 1: t + 1, n]  # built one sample at a time, in Python
        return torch.tensor(x, dtype=torch.float32), torch.tensor(self.target[t, n], dtype=torch.float32)


class NaiveForecaster(nn.Module):
    def __init__(self, d_model: int, n_layers: int, n_heads: int, d_ff: int, n_features: int, window: int,
                 dropout: float = 0.1):
        super().__init__()
        self.input = nn.Linear(n_features, d_model)
        self.pos = nn.Parameter(torch.zeros(window, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.input(x) + self.pos)
        return self.head(self.norm(h[:, -1])).squeeze(-1)  # the kit's readout: the last day


def naive_loader(dataset: WindowDataset, batch_size: int, workers: int, pin: bool) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, pin_memory=pin,
                      drop_last=True, persistent_workers=workers > 0)
