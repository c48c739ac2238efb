"""The direction model: an LSTM over a window of bars -> ONE logit. Imports only torch.

The model ends in a Linear layer, not a Sigmoid: training uses BCEWithLogitsLoss on the logit
(numerically stable; a Sigmoid in front of BCEWithLogits would squash every probability into
[0.5, 0.73]). Probabilities appear only at inference and in the exported ONNX (`UpProbability`).
"""

from __future__ import annotations

import torch
from torch import nn


class DirectionLSTM(nn.Module):
    def __init__(self, n_features: int, hidden: int = 64, layers: int = 2, dropout: float = 0.1):
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [batch, window, features] -> logit [batch] (log-odds that the price goes up)."""
        out, _ = self.lstm(x)
        return self.head(self.drop(out[:, -1])).squeeze(-1)


class UpProbability(nn.Module):
    """Inference and export: the probability of an up move, sigmoid(logit)."""

    def __init__(self, model: DirectionLSTM):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(x))


def direction_loss(logits: torch.Tensor, labels: torch.Tensor, pos_weight: torch.Tensor) -> torch.Tensor:
    """Mean BCE-with-logits over the batch; `pos_weight` (n_down / n_up of the training split) balances
    the classes. Takes the logit: never a probability."""
    return nn.functional.binary_cross_entropy_with_logits(logits, labels, pos_weight=pos_weight)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
