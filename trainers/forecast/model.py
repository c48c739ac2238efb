"""Transformer encoder over a window of daily features -> forward return. Imports only torch."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm encoder block: bidirectional self-attention (SDPA) and a GELU MLP, dropout on residuals."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff_in = nn.Linear(d_model, d_ff)
        self.ff_out = nn.Linear(d_ff, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        drop = self.dropout if self.training else 0.0
        # No dropout on attention probabilities: it forces SDPA off its fused kernels (a Bernoulli
        # mask over every [window x window] matrix, 4x the step time on CPU); residual dropout stays.
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)), drop, self.training)
        h = self.ff_out(F.gelu(self.ff_in(self.norm2(x))))
        return x + F.dropout(h, drop, self.training)


READOUTS = ("last", "mean", "attention")
ENCODERS = ("transformer", "none")


class Forecaster(nn.Module):
    """[batch, window, n_features] -> [batch] standardised forward return.

    The score is the Transformer's readout, plus (`linear_skip`) a linear map of the flattened
    window: ridge's own inputs, so the model holds the linear model as a special case and the
    Transformer has only the rest left to learn. `past_returns` (the index of the `ret_1d` feature)
    adds one input channel, the return from each day of the window to the anchor (a reverse
    cumulative sum of the normalised daily returns, in standard deviations of a return that long):
    the trailing return persistence scores by, which attention would otherwise have to assemble
    day by day. `encoder="none"` leaves the Transformer out (the linear skip alone).
    `target_mean`/`target_std` buffers turn the output back into a log return (`predict_return`);
    they travel with the weights so an exported model speaks in return units.
    """

    # Eleven parameters, not a config: a pure model file takes its sizes as numbers (GUIDE.md §3), so the export,
    # the size estimate and the tests build it without a trainer's config.
    def __init__(self, d_model: int, n_layers: int, n_heads: int, d_ff: int, n_features: int, window: int,
                 dropout: float = 0.1, readout: str = "last", linear_skip: bool = False,
                 past_returns: int | None = None, encoder: str = "transformer"):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        if readout not in READOUTS or encoder not in ENCODERS:
            raise ValueError(f"readout {readout!r} / encoder {encoder!r}: not one of {READOUTS} / {ENCODERS}")
        if encoder == "none" and not linear_skip:
            raise ValueError("encoder 'none' needs the linear skip: nothing else would forecast")
        if past_returns is not None and not 0 <= past_returns < n_features:
            raise ValueError(f"past_returns {past_returns} is not a feature index (0 .. {n_features - 1})")
        self.window = window
        self.readout = readout
        self.past_returns = past_returns
        inputs = n_features + (past_returns is not None)
        self.encoder = encoder
        if encoder == "transformer":
            self.input = nn.Linear(inputs, d_model)
            self.pos = nn.Parameter(torch.zeros(window, d_model))
            self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
            self.norm = nn.LayerNorm(d_model)
            self.pool = nn.Linear(d_model, 1) if readout == "attention" else None
            self.head = nn.Linear(d_model, 1)
        else:
            self.blocks = nn.ModuleList()
        self.skip = nn.Linear(window * inputs, 1) if linear_skip else None
        self.register_buffer("target_mean", torch.zeros(()))
        self.register_buffer("target_std", torch.ones(()))
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        if self.skip is not None:  # starts as the zero forecast; no random linear guess to unlearn
            nn.init.zeros_(self.skip.weight)
        if self.encoder == "none":
            return
        nn.init.normal_(self.pos, std=0.02)
        # residual projections scaled down with depth (GPT-2 style) for a stable start
        for block in self.blocks:
            nn.init.normal_(block.proj.weight, std=0.02 / (2 * len(self.blocks)) ** 0.5)
            nn.init.normal_(block.ff_out.weight, std=0.02 / (2 * len(self.blocks)) ** 0.5)

    def with_past_returns(self, x: torch.Tensor) -> torch.Tensor:
        """`x` with the return from each day to the anchor appended: day j of T gets the sum of the
        daily returns j..T-1, divided by sqrt(T - j) so every day's value has about unit variance."""
        if self.past_returns is None:
            return x
        r = x[..., self.past_returns]
        to_anchor = r.flip(1).cumsum(1).flip(1)
        days = torch.arange(x.shape[1], 0, -1, device=x.device, dtype=to_anchor.dtype)
        return torch.cat([x, (to_anchor * days.rsqrt()).unsqueeze(-1).to(x.dtype)], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.with_past_returns(x)
        out = self.skip(x.flatten(1)).squeeze(-1) if self.skip is not None else None
        if self.encoder == "none":
            return out
        h = self.input(x)
        # Keep the residual stream in the autocast dtype: adding the fp32 parameter as it is would
        # promote every residual add and norm input to fp32 and make each Linear cast again.
        h = h + self.pos[: x.shape[1]].to(h.dtype)
        for block in self.blocks:
            h = block(h)
        # "last" reads out at the anchor date, which attends to the whole window (a window mean
        # weighted every day alike and buried the recent ones: half the validation Rank IC on the
        # demo market, bench/results/forecast_readout_cpu.json); "attention" learns the weights.
        if self.readout == "last":
            h = self.norm(h[:, -1])
        elif self.readout == "mean":
            h = self.norm(h).mean(dim=1)
        else:
            h = self.norm(h)
            weights = torch.softmax(self.pool(h).squeeze(-1).float(), dim=1).to(h.dtype)
            h = (weights.unsqueeze(-1) * h).sum(dim=1)
        score = self.head(h).squeeze(-1)
        return score if out is None else score + out.to(score.dtype)

    def predict_return(self, x: torch.Tensor) -> torch.Tensor:
        return self(x) * self.target_std + self.target_mean


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class TrainStep(nn.Module):
    """Model and loss as one module, so `torch.compile` sees the whole forward (and DDP wraps it):
    the weighted sum of squared errors. `weight` is 0 for the padding that keeps every micro-batch
    the same shape (no recompiles at the end of an epoch), 1 otherwise; `scale` is a tensor so a
    changing global batch does not recompile either."""

    def __init__(self, model: Forecaster):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor):
        sse = (weight * (self.model(x).float() - y) ** 2).sum()
        return sse * scale, sse.detach()


class ReturnPredictor(nn.Module):
    """The export wrapper: inputs in, log returns out."""

    def __init__(self, model: Forecaster):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.predict_return(x)


def flops_per_sample(window: int, n_features: int, d_model: int, n_layers: int, d_ff: int,
                     training: bool = True, readout: str = "last", linear_skip: bool = False,
                     past_returns: bool = False, encoder: str = "transformer") -> float:
    """Matmul FLOPs for one sample (a window of `window` days): training = 3 x forward (the backward
    costs two forwards), the nanoGPT/PaLM convention MFU is defined by. The past-returns channel is
    one more input; the linear skip one product per input value; an attention readout scores every
    day (its weighted sum is elementwise, not a matmul, and not counted, as for norms)."""
    t, d = window, d_model
    inputs = n_features + past_returns
    forward = 2 * t * inputs if linear_skip else 0
    if encoder == "transformer":
        dense = 2 * t * (inputs * d + n_layers * (4 * d * d + 2 * d * d_ff)) + 2 * d  # projections + head
        attention = n_layers * 4 * t * t * d  # QK^T and attention x V
        pool = 2 * t * d if readout == "attention" else 0
        forward += dense + attention + pool
    return 3.0 * forward if training else float(forward)
