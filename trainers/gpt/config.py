"""The char-level GPT's options: one dataclass, the command line, config.json and every checkpoint.

No torch here: `trainers gpt train --help` must answer at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainers.errors import UsageError
from trainers.runtime.config import option
from trainers.runtime.options import PRECISIONS, RunOptions

PARALLEL = ("auto", "ddp", "fsdp")
SWITCH = ("auto", "on", "off")
SCHEDULES = ("wsd", "cosine")
POSITIONS = ("rotary", "learned")


@dataclass
class GptConfig(RunOptions):
    run_dir: str = option("runs/gpt", "run folder: checkpoints, logs, results (resumed if it holds a run)",
                          resume_safe=True)
    # data
    data: str = option("synthetic", "a UTF-8 text file, a folder of them, or `synthetic` (the Markov source whose "
                       "entropy is known)", resume_safe=True)  # the folder may move; its fingerprint may not change
    cache_dir: str = option("cache/gpt", "where tokenised corpora are kept (by content hash)", resume_safe=True)
    val_frac: float = option(0.05, "the last share of the corpus (by position) kept for validation", gt=0, lt=1)
    synthetic_chars: int = option(2_000_000, "characters of synthetic text", min=1)
    markov_alphabet: int = option(8, "characters of the synthetic alphabet (the last is a newline)", min=2, max=27)
    markov_order: int = option(2, "context length of the synthetic Markov chain", min=0, max=8)
    markov_concentration: float = option(0.5, "Dirichlet concentration of its next-character distributions "
                                         "(smaller: more predictable)", gt=0)
    data_seed: int = option(0, "seed of the synthetic source", min=0)
    # model
    depth: int = option(12, "layers; the width is 64 x depth (rounded to whole heads)", min=1)
    head_dim: int = option(128, "width of one attention head (smaller for tiny CPU models)", min=2)
    seq_len: int = option(2048, "context length in characters", min=2)
    positions: str = option("rotary", "position encoding", choices=POSITIONS)
    tie_embeddings: bool = option(False, "share the input embedding and the output head (DDP only)")
    # optimisation
    batch_tokens: int = option(524_288, "global batch in tokens per optimizer step (gradient accumulation fills it)",
                               min=1)
    device_batch_size: int = option(4, "sequences per GPU per micro-step", min=1)
    lr: float = option(3e-3, "peak learning rate", gt=0)
    min_lr_ratio: float = option(0.0, "final learning rate as a share of the peak", min=0, max=1)
    warmup_steps: int = option(100, "linear warmup steps", min=0)
    schedule: str = option("wsd", "wsd: warmup, stable, linear decay over the last --cooldown-frac (suits a time "
                           "budget); cosine: warmup then cosine decay", choices=SCHEDULES)
    cooldown_frac: float = option(0.2, "share of the run the wsd schedule decays over", gt=0, max=1)
    weight_decay: float = option(0.1, "AdamW weight decay on matrices", min=0)
    beta2: float = option(0.95, "AdamW beta2", gt=0, lt=1)
    grad_clip: float = option(1.0, "clip the global gradient norm to this (0: off)", min=0)
    seed: int = option(0, "seed of init and the stream's shuffling", min=0)
    # how long
    max_steps: int | None = option(None, "stop after this many optimizer steps", resume_safe=True, min=1)
    max_tokens: int | None = option(None, "stop after this many training tokens", resume_safe=True, min=1)
    # parallelism and numerics
    parallel: str = option("auto", "ddp, fsdp (FSDP2, sharded per block) or auto (the first that fits the GPU by "
                           "the memory estimate)", choices=PARALLEL)
    activation_checkpointing: str = option("auto", "recompute each block in the backward (auto: when the estimate "
                                           "says it is needed)", choices=SWITCH)
    compile: str = option("auto", "torch.compile (auto: on for CUDA, off on CPU)", resume_safe=True, choices=SWITCH)
    precision: str = option("auto", "auto: bf16 autocast on Ampere+, fp16 on older GPUs, fp32 on CPU",
                            choices=PRECISIONS)
    # evaluation, checkpoints, logging
    eval_every: int = option(250, "evaluate validation loss every N steps (and at the end)", resume_safe=True, min=1)
    eval_tokens: int = option(1 << 20, "validation tokens per evaluation (the first windows of the split)",
                              resume_safe=True, min=1)
    sample_chars: int = option(200, "characters sampled at each evaluation (0: none)", resume_safe=True, min=0)
    patience: int = option(0, "early stop after this many evaluations without improvement (0: off)",
                           resume_safe=True, min=0)
    ckpt_every: int = option(1_000_000, "checkpoint every N optimizer steps (time-based saves are the default: "
                             "--save-every-min)", resume_safe=True, min=1)
    ckpt_every_min: float | None = option(60.0, "checkpoint every N minutes of wall clock (also: --save-every-min)",
                                          resume_safe=True, gt=0, aliases=("--save-every-min",))

    def validate(self) -> None:
        """Cheap checks that need no data; run before anything touches the disk (and by preflight,
        which sizes the model from the training options without the budget flags)."""
        self.validate_run_options()
        if self.positions == "rotary" and self.head_dim % 2:  # rotary turns pairs of a head's dimensions
            raise UsageError(f"--head-dim {self.head_dim} is odd, and --positions rotary rotates pairs of a head's "
                             f"dimensions; use an even --head-dim or --positions learned")
        if self.tie_embeddings and self.parallel == "fsdp":  # with the other options, not first at the layout
            raise UsageError("--tie-embeddings works with --parallel ddp only (a tied matrix across FSDP units is not "
                             "supported here); leave it out or use --parallel ddp or auto")
        if self.data == "synthetic":
            from trainers.gpt.markov import MAX_CONTEXTS  # NumPy only

            if self.markov_alphabet ** self.markov_order > MAX_CONTEXTS:
                raise UsageError(f"--markov-alphabet {self.markov_alphabet} ** --markov-order {self.markov_order} = "
                                 f"{self.markov_alphabet ** self.markov_order:,} contexts, more than the {MAX_CONTEXTS:,} "
                                 f"whose entropy floor can be computed exactly; use a smaller alphabet or order")
        if self.device_batch_size * self.seq_len > self.batch_tokens:
            raise UsageError(f"--batch-tokens {self.batch_tokens} is smaller than one micro-batch "
                             f"(--device-batch-size {self.device_batch_size} x --seq-len {self.seq_len})")

    def check_end(self) -> None:
        """A training run needs an end: the schedule decays towards it."""
        if not (self.max_steps or self.max_tokens or self.max_hours or self.budget_usd):
            raise UsageError("give the run an end: --max-steps, --max-tokens, --max-hours or --budget-usd (the "
                             "learning-rate schedule decays towards it)")

    def grad_accum(self, world_size: int) -> int:
        """Micro-steps per optimizer step so that world x device batch x seq_len x accum = batch_tokens."""
        per_micro = self.device_batch_size * self.seq_len * world_size
        if self.batch_tokens % per_micro:
            raise UsageError(f"--batch-tokens {self.batch_tokens} is not a multiple of {world_size} rank(s) x "
                             f"--device-batch-size {self.device_batch_size} x --seq-len {self.seq_len} = {per_micro}; "
                             f"try --batch-tokens {max(1, round(self.batch_tokens / per_micro)) * per_micro}")
        return self.batch_tokens // per_micro
