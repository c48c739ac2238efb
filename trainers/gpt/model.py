"""A character-level GPT scaled by one dial, depth (nanochat's convention). Imports only torch.

    dim = 64 x depth, rounded to a whole number of heads of `head_dim` (128 by default)
    a block: x + attn(rms_norm(x)), then x + mlp(rms_norm(x))   (pre-norm, no biases)
    attention: causal scaled_dot_product_attention (flash on GPU), rotary or learned positions
    mlp: dim -> 4 dim -> dim with tanh-GELU; a parameter-free RMSNorm (nanochat) before each part

Sizes are counted from the module itself (`count_parameters`, `flops_per_token`); the pure formulas
the planner uses live in trainers/gpt/size.py and are tested against these. Generation uses a KV
cache (`generate`), deterministic for a given torch.Generator.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ROPE_BASE = 10_000.0


def model_dim(depth: int, head_dim: int, aspect: int = 64) -> int:
    """64 x depth rounded to the nearest whole number of heads (at least one)."""
    return max(1, round(aspect * depth / head_dim)) * head_dim


def rotary_tables(seq_len: int, head_dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x frequency, [seq_len, head_dim / 2], in fp32."""
    freqs = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), freqs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]: rotate each pair (first half, second half) by its position's angle."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class KVCache:
    """Keys and values of every layer, preallocated to `max_len` positions at the first append (in
    the dtype attention computes in: fp32, or bf16 under FSDP's mixed precision)."""

    def __init__(self, n_layers: int, max_len: int):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.n_layers, self.max_len = n_layers, max_len
        self.pos = 0  # positions filled (advanced by the model after its last layer)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, H, T, D] at positions pos..pos+T; returns every key and value so far."""
        if self.k is None:
            B, H, _, D = k.shape
            self.k = k.new_zeros((self.n_layers, B, H, self.max_len, D))
            self.v = v.new_zeros((self.n_layers, B, H, self.max_len, D))
        end = self.pos + k.shape[2]
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, rope, layer: int, cache: KVCache | None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).unbind(2)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
        causal = True
        if cache is not None:
            if T > 1 and cache.pos > 0:
                raise ValueError("a KV cache takes a multi-token prompt only while empty")
            k, v = cache.append(layer, k, v)
            causal = T > 1  # one new token attends to everything cached
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim, bias=False)
        self.proj = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, layer: int):
        super().__init__()
        self.layer = layer
        self.attn = Attention(dim, heads)
        self.mlp = MLP(dim)

    def forward(self, x, rope=None, cache: KVCache | None = None):
        x = x + self.attn(F.rms_norm(x, (x.shape[-1],)), rope, self.layer, cache)
        return x + self.mlp(F.rms_norm(x, (x.shape[-1],)))


class GPT(nn.Module):
    """tokens [B, T] -> logits [B, T, vocab] (or the mean cross-entropy when targets are given)."""

    def __init__(self, vocab_size: int, depth: int, head_dim: int = 128, seq_len: int = 2048,
                 positions: str = "rotary", tie_embeddings: bool = False):
        super().__init__()
        if positions not in ("rotary", "learned"):
            raise ValueError(f"positions must be rotary or learned, not {positions!r}")
        self.vocab_size, self.depth, self.seq_len, self.positions = vocab_size, depth, seq_len, positions
        self.dim = model_dim(depth, head_dim)
        self.head_dim = head_dim
        self.heads = self.dim // head_dim
        self.wte = nn.Embedding(vocab_size, self.dim)
        self.wpe = nn.Embedding(seq_len, self.dim) if positions == "learned" else None
        self.blocks = nn.ModuleList(Block(self.dim, self.heads, i) for i in range(depth))
        self.lm_head = nn.Linear(self.dim, vocab_size, bias=False)
        self.tie_embeddings = tie_embeddings
        self.tie_weights()
        self.checkpoint_blocks = False  # activation checkpointing: recompute each block in backward
        # rotary tables: not parameters, not saved; rebuilt by reset_buffers() after to_empty()
        self.register_buffer("rope_cos", torch.empty(seq_len, head_dim // 2), persistent=False)
        self.register_buffer("rope_sin", torch.empty(seq_len, head_dim // 2), persistent=False)
        if self.rope_cos.device.type != "meta":
            self.reset_buffers()
            self.init_weights(torch.Generator(self.rope_cos.device).manual_seed(0))

    def tie_weights(self) -> None:
        """One matrix for the input embedding and the output head (again after `to_empty`, which
        gives every module its own new tensor)."""
        if self.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def reset_buffers(self) -> None:
        cos, sin = rotary_tables(self.seq_len, self.head_dim, self.rope_cos.device)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def init_std(self, name: str) -> float:
        """GPT-2's init: N(0, 0.02), the projections back into the residual stream scaled by
        1/sqrt(2 x depth) so the stream's variance does not grow with depth."""
        if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
            return 0.02 / math.sqrt(2 * self.depth)
        return 0.02

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        for name, p in self.named_parameters():
            p.normal_(0.0, self.init_std(name), generator=generator)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.seq_len:
            raise ValueError(f"{start + T} positions exceed the model's {self.seq_len}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
            rope = None
        else:
            rope = (self.rope_cos[start:start + T], self.rope_sin[start:start + T])
        if torch.is_autocast_enabled(x.device.type):  # keep the residual stream in the autocast dtype
            x = x.to(torch.get_autocast_dtype(x.device.type))
        for block in self.blocks:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                x = checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope, cache)
        if cache is not None:
            cache.pos += T
        logits = self.lm_head(F.rms_norm(x, (x.shape[-1],)))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model: GPT, seq_len: int | None = None) -> float:
    """Training FLOPs per token, nanoGPT/PaLM style: 6 x the parameters every token multiplies by
    (each block's matrices and the output head; not the embedding lookups) + 12 L H Q T for
    attention scores and values."""
    seq_len = seq_len or model.seq_len
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6.0 * matmul + 12.0 * model.depth * model.heads * model.head_dim * seq_len


@torch.no_grad()
def generate(model: GPT, prompt: list[int], max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None):
    """Yield up to `max_new_tokens` token ids after `prompt`, one at a time, with a KV cache.

    temperature 0 is greedy; top_k keeps the k likeliest tokens. When the context reaches the
    model's seq_len, the cache restarts from the last seq_len / 2 tokens (deterministic)."""
    if not prompt:
        raise ValueError("generation needs a prompt of at least one token")
    device = model.rope_cos.device
    context = list(prompt[-model.seq_len:])
    cache = None
    for _ in range(max_new_tokens):
        if cache is None or cache.pos >= model.seq_len:
            if cache is not None:
                context = context[-(model.seq_len // 2):]
            cache = KVCache(model.depth, model.seq_len)
            logits = model(torch.tensor([context], device=device), cache=cache)
        else:
            logits = model(torch.tensor([[context[-1]]], device=device), cache=cache)
        token = sample_next(logits[0, -1].float(), temperature, top_k, generator)
        context.append(token)
        yield token


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> int:
    """One token. The distribution is checked on the host copy the draw needs anyway: a diverged
    model (NaN weights) has none, and is refused instead of answering garbage."""
    if temperature == 0:
        logits = logits.cpu()
        _check_finite(logits)
        return int(logits.argmax())
    logits = logits / max(temperature, 1e-6)  # a vanishing temperature must not overflow to inf - inf
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1).cpu()
    _check_finite(probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _check_finite(values: torch.Tensor) -> None:
    if not bool(torch.isfinite(values).all()):
        raise ValueError("the model's outputs are not finite numbers (did its training diverge?): nothing to sample")
