"""How big a GPT of a given depth is, how much it costs per token, and whether it fits a GPU.

Pure Python (no torch, no model built), so the planner and the CLI can answer at once; the
formulas are tested against the model itself (parameters and FLOPs on the meta device, saved
activations with autograd's saved-tensor hooks on small CPU models).

Per-GPU memory of a training step, in bytes, for these layouts:

    ddp       every rank holds everything: fp32 weights 4N, fp32 grads 4N, AdamW moments 8N,
              the bf16 weight copies autocast keeps for the backward 2N, activations
    fsdp      FSDP2 (fully_shard per block): the 16N of state divided by the world size, plus the
              unsharded bf16 weights and fp32 grads of the block being computed and the next one
    +ac       with activation checkpointing: only each block's input is kept; one block's
              activations exist at a time, during its recomputation in the backward

Activations are what autograd saves for the backward: per token and layer 18 values of the model
width (16 with learned positions: rotary keeps rotated copies of q and k) plus 2 norm statistics
and one log-sum-exp per head; the head keeps the final norm's input and output and the
log-softmax over the vocabulary. Matrices' activations are counted in the compute dtype (2 bytes
for bf16 on a GPU, 4 on a CPU), statistics in fp32. A fixed allowance covers the CUDA context,
NCCL buffers and allocator fragmentation. On a GPU these are estimates: measure with
`peak_memory_bytes` in metrics.jsonl (no GPU number here has been measured).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

SIZING_VOCAB = 256  # vocabulary assumed when the corpus is not read yet (the embedding is tiny anyway)
SMALL_STEP_S = 0.003  # the least a micro-step takes on a GPU, launches and Python, whatever its FLOPs (ASSUMED, as
# the other trainers' floors): without it a depth-2 model was planned at 428 M tokens a second
GIB = 1 << 30
OVERHEAD_BYTES = 2 * GIB  # CUDA context, NCCL buffers, allocator slack
FRAGMENTATION = 1.10  # the caching allocator rarely packs activations perfectly
LAYOUTS = ("ddp", "ddp+ac", "fsdp", "fsdp+ac")


def model_dim(depth: int, head_dim: int, aspect: int = 64) -> int:
    """64 x depth rounded to the nearest whole number of heads (the same rule as model.py)."""
    return max(1, round(aspect * depth / head_dim)) * head_dim


@dataclass(frozen=True)
class Shape:
    depth: int
    head_dim: int = 128
    vocab: int = SIZING_VOCAB
    seq_len: int = 2048
    positions: str = "rotary"
    tied: bool = False

    @property
    def dim(self) -> int:
        return model_dim(self.depth, self.head_dim)

    @property
    def heads(self) -> int:
        return self.dim // self.head_dim

    def parameters(self) -> int:
        """Every distinct parameter: 12 d^2 per block (qkv 3, out 1, mlp 4 + 4), the token embedding,
        the output head unless tied, learned positions when chosen."""
        d = self.dim
        total = self.depth * 12 * d * d + self.vocab * d
        if not self.tied:
            total += self.vocab * d
        if self.positions == "learned":
            total += self.seq_len * d
        return total

    def block_parameters(self) -> int:
        return 12 * self.dim * self.dim

    def matmul_parameters(self) -> int:
        """The parameters each token is multiplied by (blocks and head, not the lookups)."""
        return self.depth * self.block_parameters() + self.vocab * self.dim

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """6N + 12 L H Q T (nanoGPT's estimate; the attention term at the full sequence length)."""
        t = seq_len or self.seq_len
        return 6.0 * self.matmul_parameters() + 12.0 * self.depth * self.heads * self.head_dim * t

    def nominal_parameters(self) -> int:
        """12 L d^2: the usual rule of thumb (d64 ~ 12.9B)."""
        return 12 * self.depth * self.dim * self.dim


def layer_activation_bytes(shape: Shape, act_bytes: int = 2) -> int:
    """Per token, what one block saves: x, norm, qkv, rotated q and k, attention out, x + attn,
    norm, mlp hidden before and after GELU (18 d); two norm statistics, a log-sum-exp per head."""
    return (16 if shape.positions == "learned" else 18) * shape.dim * act_bytes + (2 + shape.heads) * 4


def saved_activation_bytes(shape: Shape, tokens: int, checkpointing: bool, act_bytes: int = 2) -> int:
    """What autograd holds for the backward at the end of the forward of `tokens` tokens (one rank's
    micro-batch): every block's activations, or with checkpointing only every block's input."""
    d = shape.dim
    head = 2 * d * act_bytes + shape.vocab * 4 + 2 * 8  # final norm in/out, log-softmax, ids and targets
    per_layer = d * act_bytes if checkpointing else layer_activation_bytes(shape, act_bytes)
    return tokens * (shape.depth * per_layer + head)


def activation_bytes(shape: Shape, tokens: int, checkpointing: bool, act_bytes: int = 2) -> int:
    """Peak activations: what is saved, plus with checkpointing the one block being recomputed."""
    extra = tokens * layer_activation_bytes(shape, act_bytes) if checkpointing else 0
    return saved_activation_bytes(shape, tokens, checkpointing, act_bytes) + extra


@dataclass
class Memory:
    layout: str
    world: int
    device_batch: int
    weights: int
    grads: int
    optimizer: int
    activations: int
    temporary: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations + self.temporary + self.overhead

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "total_gib": self.total / GIB}


def memory_per_gpu(shape: Shape, layout: str, world: int, device_batch: int, act_bytes: int = 2) -> Memory:
    """Peak bytes one GPU needs to train `shape` with `device_batch` sequences per micro-step."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    n = shape.parameters()
    tokens = device_batch * shape.seq_len
    sharded = layout.startswith("fsdp")
    shards = world if sharded else 1
    logits = tokens * shape.vocab * 4 * 2  # fp32 logits and their gradient
    if sharded:
        # unsharded bf16 weights of the current and the prefetched block, their fp32 grads before
        # the reduce-scatter
        temporary = 2 * shape.block_parameters() * (2 + 4) + logits
    else:
        autocast_copies = 2 * n if act_bytes == 2 else 0  # bf16 weight copies autocast saves for the backward
        temporary = autocast_copies + logits
    activations = activation_bytes(shape, tokens, layout.endswith("+ac"), act_bytes)
    return Memory(layout, world, device_batch, weights=math.ceil(4 * n / shards), grads=math.ceil(4 * n / shards),
                  optimizer=math.ceil(8 * n / shards), activations=int(activations * FRAGMENTATION),
                  temporary=temporary, overhead=OVERHEAD_BYTES)


def candidate_layouts(world: int) -> tuple[str, ...]:
    """In order of preference: no sharding, then sharding, then recomputation (sharding needs
    more than one rank to save anything)."""
    return ("ddp", "fsdp", "fsdp+ac") if world > 1 else ("ddp", "ddp+ac")


def layout_options(parallel: str, checkpointing: str, tied: bool, world: int, distributed: bool = True) -> list[str]:
    """The layouts a run may take, in its order of preference (the first that fits is taken): `--parallel auto`
    shards only across several ranks and never a tied embedding; `--activation-checkpointing on|off` keeps the
    layouts with or without recomputation. The trainer's choice and the planner's (trainers plan) both."""
    if parallel == "auto":
        options = list(candidate_layouts(world if distributed and not tied else 1))
    else:
        options = [parallel, parallel + "+ac"]
    if checkpointing != "auto":
        options = [o for o in options if o.endswith("+ac") == (checkpointing == "on")]
    return options


def largest_batch(shape: Shape, layout: str, world: int, gpu_bytes: int, act_bytes: int = 2) -> int:
    """The most sequences per micro-step that fit with `layout` (0: not even one)."""
    best, batch = 0, 1
    while batch <= 1 << 16 and memory_per_gpu(shape, layout, world, batch, act_bytes).total <= gpu_bytes:
        best, batch = batch, batch * 2
    if best == 0:
        return 0
    lo, hi = best, best * 2  # the answer is in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if memory_per_gpu(shape, layout, world, mid, act_bytes).total <= gpu_bytes:
            lo = mid
        else:
            hi = mid
    return lo


def table(shape: Shape, world: int, device_batch: int, gpu_bytes: int | None, act_bytes: int = 2) -> list[dict]:
    """Every layout's estimate, whether it fits, and the largest batch that would."""
    rows = []
    for layout in candidate_layouts(world):
        m = memory_per_gpu(shape, layout, world, device_batch, act_bytes)
        row = m.as_dict()
        if gpu_bytes is not None:
            row["fits"] = m.total <= gpu_bytes
            row["largest_device_batch"] = largest_batch(shape, layout, world, gpu_bytes, act_bytes)
        rows.append(row)
    return rows


def describe(rows: list[dict]) -> str:
    return "; ".join(f"{r['layout']} {r['total_gib']:.1f} GiB" + (f" (largest batch {r['largest_device_batch']})"
                                                                  if "largest_device_batch" in r else "")
                     for r in rows)


# ---- the planner's view (trainers plan): the same estimate as `trainers gpt size` -----------------------

CHINCHILLA_TOKENS_PER_PARAMETER = 20.0


def planned_vocab(cfg) -> tuple[int, str]:
    """(the vocabulary the run will have, how the plan knows it): the synthetic source's alphabet, or a corpus's
    distinct characters, read as the run reads it (it once assumed 256 for every corpus: a 3,000-character CJK
    file's model was planned at 81,920 parameters, and trained 433,152)."""
    if cfg.data == "synthetic":
        return cfg.markov_alphabet, f"the vocabulary is the synthetic source's {cfg.markov_alphabet} characters"
    from pathlib import Path

    import numpy as np

    from trainers.gpt.data import character_codes, check_length, read_corpus

    text, files, _skipped = read_corpus(Path(cfg.data))
    codes = character_codes(text)
    check_length(len(codes), cfg.seq_len, cfg.val_frac, f"--data {cfg.data}")  # (the run refuses it so)
    vocab = int(np.count_nonzero(np.bincount(codes)))
    return vocab, f"the vocabulary is the corpus's {vocab:,} distinct characters ({len(files)} file(s) read)"


def workload(cfg):
    """The GPT's job for `trainers plan`, with this module's memory estimate (not the generic one)."""
    from trainers.ops.plan import Workload

    vocab, vocab_note = planned_vocab(cfg)
    shape = Shape(depth=cfg.depth, head_dim=cfg.head_dim, vocab=vocab, seq_len=cfg.seq_len, positions=cfg.positions,
                  tied=cfg.tie_embeddings)

    def memory(layout: str, gpus: int, micro_tokens: int) -> dict:
        m = memory_per_gpu(shape, layout, gpus, max(1, micro_tokens // shape.seq_len))
        d = m.as_dict()
        return {k: d[k] for k in ("weights", "grads", "optimizer", "temporary", "activations", "overhead", "total")}

    # the run stops at whichever end comes first (--max-steps of whole steps, --max-tokens)
    ends = [e for e in (cfg.max_tokens, cfg.max_steps * cfg.batch_tokens if cfg.max_steps else None) if e]
    total = min(ends) if ends else None

    def order(gpus: int) -> tuple[str, ...]:
        return tuple(layout_options(cfg.parallel, cfg.activation_checkpointing, cfg.tie_embeddings, gpus))

    return Workload(
        trainer="gpt", parameters=shape.parameters(), n_blocks=shape.depth, block_parameters=shape.block_parameters(),
        unit="tokens", items_per_micro=cfg.device_batch_size * shape.seq_len, grad_accum=1,
        global_batch_items=cfg.batch_tokens, flops_per_item=shape.flops_per_token(),
        activation_bytes=lambda micro, ck: activation_bytes(shape, micro, ck), kind="transformer",
        strategies=tuple(dict.fromkeys(order(1) + order(2))), strategy_order=order, check_gpus=cfg.grad_accum,
        min_micro_step_s=SMALL_STEP_S, items_total=float(total) if total else None, memory_fn=memory,
        capped_items=(lambda _per_step: float(total)) if total else None,  # (whole steps: --batch-tokens each)
        shape={"depth": shape.depth, "dim": shape.dim, "heads": shape.heads, "seq_len": shape.seq_len},
        notes=[vocab_note])


def compute_optimal(plan, device) -> dict:
    """What the budget's FLOPs buy at about 20 tokens per parameter (Chinchilla), beside the depth asked for."""
    hours = plan.time.get("hours") or 0.0
    flops = hours * 3600 * plan.gpus * device.peak_tflops * 1e12 * plan.mfu["value"]
    n_opt = math.sqrt(flops / (6 * CHINCHILLA_TOKENS_PER_PARAMETER))
    depth = max(1, round((n_opt / (12 * 64 * 64)) ** (1 / 3)))  # 12 L d^2 with d = 64 L
    asked = plan.parameters
    line = (f"compute-optimal for this budget (about {CHINCHILLA_TOKENS_PER_PARAMETER:g} tokens per parameter): "
            f"{n_opt / 1e9:,.2f}B parameters (about depth {depth}), {CHINCHILLA_TOKENS_PER_PARAMETER * n_opt / 1e9:,.0f}B "
            f"tokens; the depth asked for has {asked / 1e9:,.2f}B parameters and would see "
            f"{(plan.time.get('items') or 0) / max(asked, 1):,.1f} tokens per parameter")
    return {"parameters": n_opt, "depth": depth, "tokens": CHINCHILLA_TOKENS_PER_PARAMETER * n_opt, "line": line}
